"""Third-party availability probes answer for the target (redirect/probes.py, docs/launchers.md).

The libraries are the real transformers, diffusers and accelerate installed here. The
probed CUDA packages (flash-attn, xformers, bitsandbytes) are not installable on this
CPU machine, so a folder on ``PYTHONPATH`` holds stand-ins of their *installation*
(package + dist-info metadata): that is what the libraries' probes look at. Each case
runs in a fresh interpreter, in both import orders (library before / after install),
and compares the answers before install, while installed, and after ``uninstall()``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

from torch_adapter.redirect import probes

FAKE_DISTS = {"flash_attn": ("flash_attn", "2.6.3"), "xformers": ("xformers", "0.0.30"),
              "bitsandbytes": ("bitsandbytes", "0.45.0")}

PROGRAM = textwrap.dedent("""
    import json, os, sys
    EARLY = sys.argv[1] == "early"

    def answers():
        import accelerate.utils as au
        import diffusers.models.attention_processor as ap
        import diffusers.utils.import_utils as di
        import transformers.utils as tu
        return {"tf.flash2": tu.is_flash_attn_2_available(), "tf.bnb": tu.is_bitsandbytes_available(),
                "df.xformers": di.is_xformers_available(), "df.ap.xformers": ap.is_xformers_available(),
                "df.bnb": di.is_bitsandbytes_available(), "acc.bnb": bool(au.is_bnb_available()),
                "acc.cuda": au.is_cuda_available()}

    if EARLY:
        before = answers()
    import torch, torch_adapter
    torch_adapter.install("cpu")
    during = answers()
    import diffusers.utils.import_utils as di, transformers.utils as tu
    from torch_adapter.core.patching import original_of
    unpatched = {"tf.flash2": original_of(tu.is_flash_attn_2_available)(),
                 "df.xformers": original_of(di.is_xformers_available)()}
    stand_in_cuda = torch.cuda.is_available()
    from diffusers import UNet2DModel
    unet = UNet2DModel(sample_size=8, block_out_channels=(8, 8), layers_per_block=1, norm_num_groups=4,
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    try:
        unet.enable_xformers_memory_efficient_attention()
        xformers_call = "enabled"
    except Exception as exc:
        xformers_call = type(exc).__name__ + ": " + str(exc)[:120]
    log = [e.asked for e in torch_adapter.current().redirect_log.entries() if e.kind == "probe"]
    torch_adapter.uninstall()
    after = answers()
    if not EARLY:
        before = None
    print(json.dumps({"before": before, "during": during, "after": after, "unpatched": unpatched,
                      "stand_in_cuda": stand_in_cuda, "xformers_call": xformers_call, "log": log,
                      "finders": [type(f).__name__ for f in sys.meta_path]}))
""")


@pytest.fixture(scope="module")
def fake_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    for pkg, (dist, version) in FAKE_DISTS.items():
        (site / pkg).mkdir()
        (site / pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
        (site / pkg / "ops.py").write_text("def memory_efficient_attention(*args, **kwargs):\n"
                                           "    raise RuntimeError('a CUDA kernel')\n")
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
        (info / "top_level.txt").write_text(pkg + "\n")
        (info / "RECORD").write_text(f"{pkg}/__init__.py,,\n")
    return site


def _run(order: str, site) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    res = subprocess.run([sys.executable, "-c", PROGRAM, order], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", ["early", "late"])
def test_probes_answer_for_the_target_and_come_back_after_uninstall(order, fake_site):
    got = _run(order, fake_site)
    # while installed: the CUDA-only packages are reported missing, so the portable paths run
    assert got["during"] == {"tf.flash2": False, "tf.bnb": False, "df.xformers": False, "df.ap.xformers": False,
                             "df.bnb": False, "acc.bnb": False, "acc.cuda": True}
    # ... and without the patch they would not be: the library's own answer under the adapter (answers it
    # cached before install are forgotten at install and again at uninstall)
    assert got["unpatched"] == {"tf.flash2": True, "df.xformers": True}
    assert got["xformers_call"].startswith("ModuleNotFoundError")  # diffusers' own refusal, not an xformers crash
    assert {"transformers.is_flash_attn_2_available()", "diffusers.is_xformers_available()"} <= set(got["log"])
    # accelerate's NVML-based check is kept: it agrees with the torch.cuda stand-in
    assert got["during"]["acc.cuda"] is got["stand_in_cuda"] is True
    assert "_ProbeFinder" not in got["finders"]
    # after uninstall: the libraries' own answers (the fake installs are visible again)
    assert got["after"]["df.xformers"] is True and got["after"]["df.ap.xformers"] is True
    assert got["after"]["acc.cuda"] is False and got["after"]["tf.flash2"] is False  # no CUDA on this machine
    if order == "early":
        assert got["after"] == got["before"]


@pytest.mark.parametrize("probe", [p for p in probes.PROBES], ids=lambda p: f"{p.module.split('.')[0]}.{p.name}")
def test_every_table_row_names_a_real_probe(probe):
    """The table does not rot: each row is a function of the installed library, same signature once patched."""
    module = importlib.import_module(probe.module)
    owner, attr = probes.owner_of(module, probe.name)
    original = getattr(owner, attr, None)
    if probe.gone_in is not None:
        from packaging.version import Version

        installed = importlib.metadata.version(probe.module.split(".")[0])
        if Version(installed) >= Version(probe.gone_in):  # the row says it is gone: it is, and nothing breaks
            assert original is None, f"{probe.module}.{probe.name} is back in {installed}: drop gone_in"
            return
    assert callable(original), f"{probe.module}.{probe.name} does not exist in the installed version"
    if probe.answer is probes.KEEP:
        return
    state = probes._State(type("S", (), {"redirect_log": None})(), {})
    stand_in = probes._stand_in(original, probe, state)
    assert inspect.signature(stand_in) == inspect.signature(original)
    assert probe.why and probe.answer in (False, True)


def test_a_real_cuda_target_keeps_every_probe():
    cuda = type("T", (), {"device_type": "cuda", "simulated": False})()
    sim = type("T", (), {"device_type": "cuda", "simulated": True})()
    npu = type("T", (), {"device_type": "npu", "simulated": False})()
    assert [probes.patched_probes(type("S", (), {"target": t})()) for t in (cuda, sim, npu)] == [False, True, True]


def test_a_transformers_model_loads_with_hub_kernels_answered_off(tmp_path):
    """transformers 5.x loads with ``use_kernels=True`` by default and refuses ("Kernels are not
    available") when ``is_kernels_available()`` says False — which the adapter answers: its own off
    switch (``USE_HUB_KERNELS=0``) is answered too, so ``from_pretrained`` loads the model's own layers."""
    transformers = pytest.importorskip("transformers")
    import torch

    import torch_adapter

    config = transformers.CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4,
                                         num_hidden_layers=2, vocab_size=99)
    torch.manual_seed(0)
    transformers.CLIPTextModel(config).save_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 7, 2]])
    want = transformers.CLIPTextModel.from_pretrained(tmp_path)(ids).last_hidden_state
    with torch_adapter.adapted("cpu") as session:
        model = transformers.CLIPTextModel.from_pretrained(tmp_path).to("cuda")
        got = model(ids.cuda()).last_hidden_state
        asked = {e.asked for e in session.redirect_log.entries() if e.kind == "probe"}
    assert not getattr(model, "use_kernels", False)
    torch.testing.assert_close(got, want)
    assert "transformers._kernels_enabled()" in asked or not hasattr(
        importlib.import_module("transformers.integrations.hub_kernels"), "_kernels_enabled")



def test_transformers_imported_while_installed_loads_plainly_after_uninstall(tmp_path):
    """transformers first imported under the adapter (a notebook's usual order): from_pretrained
    works while installed and, after uninstall, plainly — its import-time kernel choice must not
    have been made from an answer of ours (the stubs that raise "requires `kernels`")."""
    pytest.importorskip("transformers")
    code = textwrap.dedent(f"""
        import torch, torch_adapter
        torch_adapter.install("cpu")
        import transformers
        config = transformers.CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4,
                                             num_hidden_layers=2, vocab_size=99)
        torch.manual_seed(0)
        transformers.CLIPTextModel(config).save_pretrained({str(tmp_path)!r})
        ids = torch.tensor([[1, 5, 7, 2]])
        during = transformers.CLIPTextModel.from_pretrained({str(tmp_path)!r}).cuda()(ids.cuda()).last_hidden_state
        torch_adapter.uninstall()
        after = transformers.CLIPTextModel.from_pretrained({str(tmp_path)!r})(ids).last_hidden_state
        torch.testing.assert_close(during, after)
        print("LOADED-BOTH")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0 and "LOADED-BOTH" in res.stdout, res.stderr[-3000:]
