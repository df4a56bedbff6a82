"""The dtype policy (redirect/dtype_policy.py): what a float16 request gives on a CPU target.

Each CPU kind is forced (``cpu_features.forced``), so both sides of ``auto`` run on whatever
machine CI lands on: float32 tensors where float16 is computed in float32 (no low-precision units),
float16 tensors where the CPU has bf16 or fp16 units.
"""

from __future__ import annotations

import collections
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_adapter
from conftest import run_cli
from torch_adapter.core.cpu_features import forced

F16, F32 = torch.float16, torch.float32
AUTO = {"dtype_policy": "auto"}  # the default, spelled out (the off switch: "float16", tensors as asked)


def _requests() -> dict[str, torch.dtype]:
    """Every way a CUDA-written program asks for float16 on the device, and the dtype it got."""
    x = torch.randn(3, device="cuda")
    h = torch.randn(3).to(F16)  # float16 made off the device (e.g. from a file), before the session maps it
    got = {
        "Tensor.half()": x.half(),
        "Tensor.to(float16)": x.to(F16),
        "Tensor.to(device, float16)": x.to("cuda", F16),
        "Tensor.to(device=, dtype=)": x.to(device="cuda", dtype=torch.half),
        "Tensor.to(dtype=)": x.to(dtype=F16),
        "factory(device=cuda, dtype=)": torch.zeros(2, device="cuda", dtype=F16),
        "randn(device=cuda, dtype=)": torch.randn(2, device=torch.device("cuda", 0), dtype=F16),
        "tensor(device=cuda, dtype=)": torch.tensor([1.0], device="cuda", dtype=F16),
        "Tensor.type(float16)": x.type(F16),
        "Tensor.type('torch.cuda.HalfTensor')": x.type("torch.cuda.HalfTensor"),
        "float16 tensor .cuda()": h.cuda(),
        "float16 tensor .to('cuda')": h.to("cuda"),
        "Module.half()": torch.nn.Linear(2, 2).half().weight,
        "Module.to(device, float16)": torch.nn.Linear(2, 2).to("cuda", F16).weight,
        "Module.to(dtype=float16)": torch.nn.Linear(2, 2).to(dtype=F16).weight,
        "float16 Module.to('cuda')": torch.nn.Linear(2, 2).to(torch.float64).to(F16).to("cpu").cuda().weight,
    }
    return {k: v.dtype for k, v in got.items()}


def test_every_float16_request_gives_float32_where_float16_is_computed_in_float32():
    with forced("avx2"), torch_adapter.adapted("cpu", **AUTO) as session:
        got = _requests()
        rows = [e for e in session.redirect_log.entries() if e.kind == "dtype"]
    assert got == {k: F32 for k in got}, {k: v for k, v in got.items() if v is not F32}
    assert rows and all(e.became.startswith("float32 [dtype_policy='auto': float16 work is computed in float32 here "
                                            "(this CPU has no fp16 or bf16 units") for e in rows), rows[0].became
    assert all(e.file.endswith("test_dtype_policy.py") for e in rows), {e.file for e in rows}  # the user's lines
    assert torch.randn(2).half().dtype is F16 and torch.randn(2).to(F16).dtype is F16  # uninstalled: torch's


@pytest.mark.parametrize("kind, options, expected", [
    ("avx2", {}, F32),
    ("avx512", {}, F32),
    ("avx512_bf16", {}, F16),  # bf16 units: float16 stays, its heavy ops computed in bfloat16
    ("amx_fp16", {}, F16),  # native float16
    ("avx512_bf16", {"dtype_policy": "float32"}, F32),
    ("avx512_bf16", {"float16_compute": "float32"}, F32),  # auto follows the compute dtype chosen
    ("avx2", {"dtype_policy": "float16"}, F16),
    ("avx2", {"float16_compute": "float16"}, F16),  # the off switch of the rewrite: float16 as asked
])
def test_each_kind_and_setting_gets_its_dtype(kind, options, expected):
    with forced(kind), torch_adapter.adapted("cpu", **{**AUTO, **options}):
        got = _requests()
    assert set(got.values()) == {expected}, got


def test_a_simulated_target_keeps_the_programs_dtypes():
    with forced("avx2"), torch_adapter.adapted("mps", simulate=True, **AUTO):
        assert torch.randn(2, device="cuda").half().dtype is F16


def test_configure_switches_the_policy_at_once_and_back():
    with forced("avx2"), torch_adapter.adapted("cpu", **AUTO):
        assert torch.randn(2).half().dtype is F32
        torch_adapter.configure(dtype_policy="float16")
        assert torch.randn(2).half().dtype is F16
        torch_adapter.configure(dtype_policy="auto")
        assert torch.randn(2).half().dtype is F32
    assert torch.Tensor.half is torch._C.TensorBase.half  # torch's own method again


class _HalfOps(TorchDispatchMode):
    """Counts the aten ops that saw a float16 tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves = torch.utils._pytree.tree_leaves((args, kwargs, out))
        if any(isinstance(t, torch.Tensor) and t.dtype is F16 for t in leaves):
            self.ops[str(func)] += 1
        return out


def _device_aware_unet() -> torch.Tensor:
    """diffusers' way of choosing the inference dtype, a small SD UNet (random weights), under autocast."""
    from diffusers import UNet2DConditionModel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32).eval().to(device, dtype)
    x = torch.randn(1, 4, 8, 8, device=device, dtype=dtype)
    text = torch.randn(1, 4, 32, device=device, dtype=dtype)
    with torch.no_grad(), torch.autocast(device, enabled=device == "cuda"):
        return model(x, torch.tensor([10], device=device), encoder_hidden_states=text).sample


def test_the_device_aware_program_runs_its_float32_path_bit_for_bit():
    pytest.importorskip("diffusers")
    plain = _device_aware_unet()
    assert plain.dtype is F32
    watch = _HalfOps()
    with forced("avx2"), torch_adapter.adapted("cpu", **AUTO) as session:
        with watch:
            adapted = _device_aware_unet()
        amp = [e.became for e in session.redirect_log.entries() if e.kind == "amp"]
    assert adapted.dtype is F32 and torch.equal(adapted, plain)  # the kernels plain torch runs
    assert not watch.ops, watch.ops  # no float16 tensor met any op
    assert amp == ["autocast('cpu', float32) disabled [amp_dtype=auto; dtype_policy='auto': float16 work is "
                   "computed in float32 here (this CPU has no fp16 or bf16 units: both are emulated there, float32 "
                   "is faster; float16_compute='auto')]"]


def test_autocast_in_bfloat16_and_an_explicit_amp_dtype_are_left_as_asked():
    with forced("avx2"), torch_adapter.adapted("cpu", **AUTO):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert torch.get_autocast_dtype("cpu") is torch.bfloat16 and torch.is_autocast_enabled("cpu")
    with forced("avx2"), torch_adapter.adapted("cpu", amp_dtype="float16", **AUTO):
        with torch.autocast("cuda", dtype=F16):
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") is F16


def test_float16_tensors_loaded_onto_the_device_take_the_policys_dtype(tmp_path):
    import safetensors.torch as st  # (its functions looked up while installed, as a script run by `run` does)

    sd = collections.OrderedDict(w=torch.randn(2, 2).half(), n=torch.arange(3), f=torch.randn(2))
    sd._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    torch.save({"model": sd, "step": 7}, tmp_path / "ckpt.pt")
    st.save_file(dict(sd), str(tmp_path / "w.safetensors"))
    with forced("avx2"), torch_adapter.adapted("cpu", **AUTO):
        onto = torch.load(tmp_path / "ckpt.pt")  # a CUDA program's checkpoint: onto the device
        cuda = torch.load(tmp_path / "ckpt.pt", map_location="cuda")
        host = torch.load(tmp_path / "ckpt.pt", map_location="cpu")  # the host's: the file's dtypes
        st_cuda = st.load_file(str(tmp_path / "w.safetensors"), device="cuda")
        st_host = st.load_file(str(tmp_path / "w.safetensors"))
    for got in (onto["model"], cuda["model"], st_cuda):
        assert {k: v.dtype for k, v in got.items()} == {"w": F32, "n": torch.int64, "f": F32}
        assert torch.equal(got["w"], sd["w"].float()) and torch.equal(got["f"], sd["f"])
    assert type(onto["model"]) is collections.OrderedDict and onto["model"]._metadata == sd._metadata
    assert onto["step"] == 7
    assert host["model"]["w"].dtype is F16 and st_host["w"].dtype is F16


def test_bit_views_and_host_float16_are_left_alone():
    with forced("avx2"), torch_adapter.adapted("cpu", **AUTO):
        x = torch.randn(4, device="cuda")
        assert x.view(torch.int16).view(F16).dtype is F16  # a reinterpretation, not a request
        assert torch.zeros(2, dtype=F16).dtype is F16  # float16 on the host, not on the device
        assert torch.empty(2, dtype=F16, device="cpu").dtype is F16
        assert torch.randn(2).to(torch.bfloat16).dtype is torch.bfloat16


def test_saved_weights_are_float32_under_the_policy_and_float16_without(tmp_path):
    with forced("avx2"), torch_adapter.adapted("cpu", **AUTO):
        torch.save(torch.nn.Linear(2, 2).cuda().half().state_dict(), tmp_path / "a.pt")
    with forced("avx2"), torch_adapter.adapted("cpu", dtype_policy="float16"):  # the off switch: float16 as asked
        torch.save(torch.nn.Linear(2, 2).cuda().half().state_dict(), tmp_path / "b.pt")
    assert {v.dtype for v in torch.load(tmp_path / "a.pt").values()} == {F32}
    assert {v.dtype for v in torch.load(tmp_path / "b.pt").values()} == {F16}


def test_targets_shows_what_float16_tensors_are():
    done = run_cli("targets", "--json", env={"TORCH_ADAPTER_CPU_FEATURES": "avx2"})
    assert done.returncode == 0, done.stderr
    cpu = next(r for r in json.loads(done.stdout) if r["name"] == "cpu")["details"]
    assert cpu["float16_tensors"] == "float32 under dtype_policy='auto' (the default)"
    with forced("avx512_bf16"):
        assert torch_adapter.describe("cpu")["details"]["float16_tensors"] == "float16 under dtype_policy='auto' (the default)"


def test_a_bad_policy_is_a_usage_error_naming_the_allowed_ones(tmp_path):
    from torch_adapter.errors import UsageError

    with pytest.raises(UsageError, match=r"dtype_policy.*'auto', 'float16', 'float32'"):
        torch_adapter.install("cpu", dtype_policy="bfloat16")
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    done = run_cli("run", "--dtype-policy", "fp16", str(script))
    assert done.returncode == 2 and "ran" not in done.stdout
    assert "invalid choice: 'fp16'" in done.stderr and "'auto', 'float16', 'float32'" in done.stderr, done.stderr


@pytest.mark.parametrize("flags, expected", [(("--dtype-policy", "float16"), "torch.float16"), ((), "torch.float32"),
                                             (("--dtype-policy", "auto"), "torch.float32")])
def test_run_hands_the_policy_to_the_script(tmp_path, flags, expected):
    script = tmp_path / "s.py"
    script.write_text("import torch\nprint(torch.randn(2, device='cuda').half().dtype)\n")
    done = run_cli("run", *flags, str(script), env={"TORCH_ADAPTER_CPU_FEATURES": "avx2"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [expected], done.stdout


def test_auto_is_the_default():
    with forced("avx2"), torch_adapter.adapted("cpu") as session:
        assert session.config.dtype_policy == "auto"
        assert torch.randn(2, device="cuda").half().dtype is F32
    with forced("avx512_bf16"), torch_adapter.adapted("cpu"):
        assert torch.randn(2, device="cuda").half().dtype is F16


class _Seen(torch.Tensor):
    """A program's tensor subclass that records the calls it sees."""
    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("half", [False, True], ids=["float32", "float16"])
def test_a_subclass_sees_only_its_own_calls_under_the_policy(half):
    """The policy looks at a moved tensor's dtype: a subclass's __torch_function__ must not see that look."""
    with forced("avx2"), torch_adapter.adapted("cpu", **AUTO):
        s = torch.zeros(2, dtype=F16 if half else F32).as_subclass(_Seen)
        _Seen.seen.clear()
        moved, cuda = s.to("cuda"), s.cuda()
        assert _Seen.seen == [torch.Tensor.to, torch.Tensor.cuda], _Seen.seen
        assert moved.dtype is cuda.dtype is F32 and type(moved) is _Seen


def test_the_adapters_own_float16_casts_are_not_the_policys():
    """A float16 tensor made before the session keeps float16 through the adapter's own kernels: the
    heavy-op rewrite's Half kernel returns Half (routing/low_precision.py) and the batch-norm rule casts
    the input to the float16 weights (redirect/amp.py) though the names Tensor.half/.to map float16."""
    torch.manual_seed(0)
    a, b = torch.randn(8, 8).half(), torch.randn(8, 8).half()
    conv, bn = torch.nn.Conv2d(4, 4, 1).half(), torch.nn.BatchNorm2d(4).half()
    x = torch.randn(2, 4, 3, 3, dtype=F16)
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", dtype_policy="float32") as session:
        assert session.device_mapper.half_as is F32 and torch.randn(2).half().dtype is F32  # the names map
        assert torch.mm(a, b).dtype is F16  # computed in bfloat16, returned as float16
    torch.testing.assert_close(torch.mm(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=5e-2)
    with forced("avx2"), torch_adapter.adapted("cpu", amp_dtype="bfloat16", **AUTO):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = bn(conv(x))  # conv in bfloat16, the float16 batch norm takes its input in float16
    assert y.dtype is F16


# CI runs this file a second time as a CPU without bf16 units (TORCH_ADAPTER_CPU_FEATURES=avx2): .ci/run
pytestmark = pytest.mark.cpu_kind
