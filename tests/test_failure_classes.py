"""One distilled case per class of failure seen in real CUDA-written programs (issue 16).

Each test runs the behaviour a real program relies on (where a tensor lands, whether a
forward/backward runs), under the adapter and after it, rather than checking attributes.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn
from torch.utils import _device

import torch_adapter


# --- torch's device context (torch.utils._device) -------------------------------------------
def _fresh_constructor_cache():
    """As in a fresh interpreter: torch has not built its factory set yet."""
    _device._device_constructors.cache_clear()


def _context_devices() -> dict[str, str]:
    out = {}
    with torch.device("meta"):
        out["meta empty"] = torch.empty(2).device.type
        out["meta zeros"] = torch.zeros(2, 3).device.type
        out["meta arange"] = torch.arange(3).device.type
        out["meta tensor"] = torch.tensor([1.0]).device.type
        out["meta Linear"] = nn.Linear(2, 2).weight.device.type
    torch.set_default_device("meta")
    try:
        out["default randn"] = torch.randn(2).device.type
        out["default full"] = torch.full((2,), 1.0).device.type
    finally:
        torch.set_default_device(None)
    out["plain"] = torch.ones(1).device.type
    return out


EXPECTED = {"meta empty": "meta", "meta zeros": "meta", "meta arange": "meta", "meta tensor": "meta",
            "meta Linear": "meta", "default randn": "meta", "default full": "meta", "plain": "cpu"}


@pytest.mark.parametrize("built_before_install", [False, True])
def test_device_context_works_during_and_after_install(built_before_install):
    assert _context_devices() == EXPECTED
    if not built_before_install:
        _fresh_constructor_cache()
    torch_adapter.install("cpu")
    assert _context_devices() == EXPECTED
    with torch.device("cuda"):
        assert torch.empty(1).device.type == "cpu"
    torch_adapter.uninstall()
    assert _context_devices() == EXPECTED
    assert not any(getattr(f, "__torch_adapter_original__", None) for f in _device._device_constructors())


def test_factory_set_first_built_while_installed_holds_torchs_own_functions():
    _fresh_constructor_cache()
    torch_adapter.install("cpu")
    try:
        cached = _device._device_constructors()
        assert torch.empty is not torch.empty.__wrapped__  # wrapped now
        # torch's own function, and the stand-in beside it (redirect/torch_tables.py: a mode is
        # handed the stand-in, the object the program named)
        assert torch.empty.__wrapped__ in cached and torch.empty in cached
    finally:
        torch_adapter.uninstall()
    assert torch.empty in _device._device_constructors()
    assert not any(getattr(f, "__torch_adapter_original__", None) for f in _device._device_constructors())


# --- nn.DataParallel on the host ------------------------------------------------------------
def test_data_parallel_cuda_runs_forward_and_backward_on_the_host():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    x = torch.randn(5, 4)
    expected = plain(x).sum()
    expected.backward()
    grads = [p.grad.clone() for p in plain.parameters()]
    plain.zero_grad()

    torch_adapter.install("cpu")
    model = nn.DataParallel(plain).cuda()
    model_ids = nn.DataParallel(plain, device_ids=[0], output_device=0).cuda()
    for m in (model, model_ids):
        out = m(x.cuda()).sum()
        out.backward()
        assert out.device.type == "cpu" and torch.equal(out, expected)
        assert all(torch.equal(p.grad, g) for p, g in zip(plain.parameters(), grads))
        plain.zero_grad()
    from torch.nn.parallel import data_parallel

    assert torch.equal(data_parallel(plain, x.cuda(), device_ids=[0]).sum(), expected)


def test_data_parallel_patch_is_on_the_module_not_the_function():
    session = torch_adapter.install("cpu")
    module = sys.modules["torch.nn.parallel.data_parallel"]
    assert session.patcher.is_patched(module, "_get_available_device_type")
    assert "_get_available_device_type" not in vars(torch.nn.parallel.data_parallel)  # the function


# --- integer device ordinals ----------------------------------------------------------------
INT_CALLS = {
    "Tensor.to(0)": lambda: torch.ones(2).to(0),
    "Tensor.to(device=0)": lambda: torch.ones(2).to(device=0),
    "Tensor.to(0, float16)": lambda: torch.ones(2).to(0, torch.float16),
    "Tensor.cuda(0)": lambda: torch.ones(2).cuda(0),
    "Module.to(0)": lambda: nn.Linear(2, 2).to(0).weight,
    "Module.to(device=0)": lambda: nn.Linear(2, 2).to(device=0).weight,
    "Module.to(0, dtype)": lambda: nn.Linear(2, 2).to(0, torch.float64).weight,
    "Module.cuda(0)": lambda: nn.Linear(2, 2).cuda(0).weight,
    "torch.zeros(device=0)": lambda: torch.zeros(2, device=0),
    "torch.tensor(device=0)": lambda: torch.tensor([1, 2], device=0),
    "ones_like(device=0)": lambda: torch.ones_like(torch.ones(2), device=0),
    "new_zeros(device=0)": lambda: torch.ones(2).new_zeros(3, device=0),
    "Module.to_empty(device=0)": lambda: nn.Linear(2, 2).to_empty(device=0).weight,
    "Generator(device=0)": lambda: torch.randn(2, generator=torch.Generator(device=0)),
}


@pytest.mark.parametrize("name", sorted(INT_CALLS))
def test_int_ordinals_mean_the_target(name):
    with pytest.raises(RuntimeError, match="accelerator"):
        INT_CALLS[name]()  # without the adapter: "Cannot access accelerator device ..."
    torch_adapter.install("cpu")
    assert INT_CALLS[name]().device.type == "cpu"


def test_default_device_int_ordinal():
    torch_adapter.install("cpu")
    torch.set_default_device(0)
    try:
        assert torch.empty(1).device.type == "cpu"
    finally:
        torch.set_default_device(None)


# --- the redirect log names the user's line -------------------------------------------------
def test_redirect_from_inside_a_library_names_the_users_line_and_the_library_line():
    from accelerate.utils import send_to_device

    session = torch_adapter.install("cpu")
    send_to_device(torch.ones(2), "cuda")
    line = sys._getframe().f_lineno - 1
    torch.ones(2).cuda()  # line + 2
    rows = {e.asked: e for e in session.redirect_log.entries()}
    via = rows["Tensor.to('cuda')"]
    assert (via.file, via.line) == (__file__, line)
    assert via.library["file"].endswith("accelerate/utils/operations.py")
    assert via.as_dict()["library"] == via.library
    direct = rows["Tensor.cuda()"]
    assert (direct.line, direct.library) == (line + 2, None)
    from rich.console import Console

    console = Console(width=300, record=True)
    console.print(session.redirect_log.render())
    assert f"test_failure_classes.py:{line} (via accelerate/utils/operations.py:" in console.export_text()


# --- meta-device init of a transformers model (from_pretrained) ------------------------------
@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=12, bos_token_id=0, eos_token_id=2,
                         pad_token_id=1)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("clip")
    CLIPTextModel(cfg).save_pretrained(path)
    return path


def _load_clip(path, **kwargs):
    from transformers import CLIPTextModel

    return CLIPTextModel.from_pretrained(path, **kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"low_cpu_mem_usage": True}, {"device_map": {"": 0}},
                                    {"device_map": "auto"}, {"device_map": 0}],
                         ids=["default", "low_cpu_mem_usage", "device_map={'':0}", "device_map=auto", "device_map=0"])
def test_from_pretrained_under_the_adapter_matches_an_eager_load(tiny_clip, kwargs):
    eager = _load_clip(tiny_clip).eval()
    ids = torch.tensor([[0, 5, 9, 33, 2]])
    expected = eager(ids).last_hidden_state
    _fresh_constructor_cache()  # as in a fresh `torch-adapter run`: first built while installed
    torch_adapter.install("cpu")
    model = _load_clip(tiny_clip, **kwargs).eval()
    buffers = dict(model.named_buffers())
    for name, buf in eager.named_buffers():
        assert torch.equal(buffers[name], buf), name  # position_ids: not garbage
    for name, param in eager.named_parameters():
        assert torch.equal(dict(model.named_parameters())[name], param), name
    assert torch.equal(model(ids.cuda()).last_hidden_state, expected)
    torch_adapter.uninstall()
    again = _load_clip(tiny_clip).eval()  # after uninstall: torch's meta init still works
    assert torch.equal(again.embeddings.position_ids, eager.embeddings.position_ids)


def test_torch_device_int_means_cuda_ordinal_and_pickles_as_torchs():
    import copy
    import copyreg
    import pickle

    c_device = torch.device
    plain = pickle.dumps([torch.device("cuda", 0), torch.device("cpu")])
    with pytest.raises(RuntimeError, match="accelerator"):
        torch.device(0)
    torch_adapter.install("cpu")
    dev = torch.device(0)
    assert type(dev) is c_device and dev == c_device("cuda", 0)  # the real object, mapped where used
    assert isinstance(dev, torch.device) and issubclass(c_device, torch.device)
    assert torch.zeros(1, device=torch.device(1)).device.type == "cpu"
    assert nn.Linear(2, 2).to(torch.device(0)).weight.device.type == "cpu"
    assert torch.device("meta").type == "meta" and torch.device("cuda", 1).index == 1
    assert pickle.dumps([torch.device("cuda", 0), torch.device("cpu")]) == plain  # files never name the adapter
    assert copy.deepcopy(dev) == dev and pickle.loads(plain)[0] == dev
    torch_adapter.uninstall()
    assert torch.device is c_device and c_device not in copyreg.dispatch_table
    with pytest.raises(RuntimeError, match="accelerator"):
        torch.device(0)


@pytest.mark.parametrize("device_map", [{"": 0}, "auto", "balanced"])
def test_accelerate_dispatch_model_with_int_and_automatic_device_maps(device_map):
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    expected = model(x)
    torch_adapter.install("cpu")
    if isinstance(device_map, str):
        max_memory = get_balanced_memory(model) if device_map == "balanced" else None
        device_map = infer_auto_device_map(model, max_memory=max_memory)
    dispatched = dispatch_model(model, device_map=device_map)
    out = dispatched(x.cuda())
    assert out.device.type == "cpu" and torch.equal(out, expected)


def _gpu_checkpoint(path):
    """A checkpoint as torch.save writes it on a GPU machine: storages tagged 'cuda:0'."""
    import io
    import zipfile

    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("data.pkl"):
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            out.writestr(info, data)


@pytest.mark.parametrize("map_location,device", [({"cuda:0": "cpu"}, "cpu"), ({"cuda:0": "meta"}, "meta"),
                                                 ({"cuda:0": "cuda:1"}, "cpu"), ({}, "cpu"), ("cuda", "cpu"),
                                                 (torch.device("cuda", 0), "cpu")])
def test_gpu_checkpoint_with_map_location(tmp_path, map_location, device):
    path = tmp_path / "gpu.pt"
    _gpu_checkpoint(path)
    torch_adapter.install("cpu")
    w = torch.load(path, map_location=map_location)["w"]
    assert w.device.type == device
    if device != "meta":
        assert w.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_torch_overrides_tables_first_built_while_installed_are_rebuilt_after():
    import torch.overrides as overrides

    for cache in (overrides._get_overridable_functions, overrides.get_ignored_functions,
                  overrides.get_testing_overrides):
        cache.cache_clear()
    torch_adapter.install("cpu")
    wrapper = torch.zeros_like
    assert wrapper in overrides.get_overridable_functions()[torch]  # built from the wrappers now
    assert torch.zeros in overrides.get_ignored_functions()
    torch_adapter.uninstall()
    funcs = overrides.get_overridable_functions()[torch]
    assert torch.zeros_like in funcs and wrapper not in funcs
    assert torch.zeros in overrides.get_ignored_functions()
    assert torch.zeros_like in overrides.get_testing_overrides()


@pytest.fixture(scope="module")
def tiny_unet(tmp_path_factory):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=8,
                                attention_head_dim=2, norm_num_groups=4)
    path = tmp_path_factory.mktemp("unet")
    unet.save_pretrained(path)
    return path


@pytest.mark.parametrize("kwargs", [{}, {"device_map": {"": 0}}], ids=["low_cpu_mem_usage", "device_map={'':0}"])
def test_diffusers_from_pretrained_under_the_adapter_matches_an_eager_load(tiny_unet, kwargs):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(1)
    x, t, ctx = torch.randn(1, 4, 8, 8), torch.tensor([3]), torch.randn(1, 5, 8)
    expected = UNet2DConditionModel.from_pretrained(tiny_unet).eval()(x, t, ctx).sample
    _fresh_constructor_cache()
    torch_adapter.install("cpu")
    model = UNet2DConditionModel.from_pretrained(tiny_unet, **kwargs).eval()
    assert torch.equal(model(x.cuda(), t.cuda(), ctx.cuda()).sample, expected)


def test_fx_code_with_a_device_constant_runs_while_installed():
    """torch.fx binds the global ``device`` only when the C type equals ``torch.device``; the
    stand-in must compare equal, or graphs printing ``device(type='cpu')`` (every exported
    program reloaded by torch.export.load) fail with NameError."""

    def f(x):
        return x + torch.ones_like(x, device=torch.device("cpu"))

    torch_adapter.install("cpu")
    assert torch.device == type(torch.device("cpu")) and hash(torch.device) == hash(type(torch.device("cpu")))
    gm = torch.fx.symbolic_trace(f)
    assert "device(type='cpu')" in gm.code
    assert gm(torch.zeros(3)).tolist() == [1.0, 1.0, 1.0]
