"""Redirection in-process: spellings, threads, the log, AMP policy, env, distributed, errors."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading

import pytest
import torch

import torch_adapter
from torch_adapter.errors import TargetError, UnsupportedCudaFeature, UsageError
from torch_adapter.redirect import cuda_ns
from torch_adapter.redirect.amp import effective_dtype
from torch_adapter.redirect.distributed import map_backend
from torch_adapter.redirect.env import AdapterEnvWarning

HERE = os.path.abspath(__file__)


@pytest.mark.parametrize("spelling", ["cuda", "cuda:0", "cuda:1", torch.device("cuda"), torch.device("cuda", 1), 0, 1])
def test_every_device_spelling_maps_to_the_target(spelling):
    torch_adapter.install("cpu")
    assert torch.zeros(2, device=spelling).device == torch.device("cpu")
    assert torch.ones(2).to(spelling).device == torch.device("cpu")
    assert torch.ones(2).new_empty(3, device=spelling).device == torch.device("cpu")


def test_non_cuda_devices_and_dtypes_pass_through_untouched():
    # dtype_policy="float16": under the default (auto) a CPU without bf16 units answers a float16
    # request with float32, logged (tests/test_dtype_policy.py); here, that nothing else is touched
    torch_adapter.install("cpu", dtype_policy="float16")
    x = torch.ones(2)
    assert x.to(torch.float16).dtype == torch.float16
    assert x.to("meta").device.type == "meta"
    assert torch.zeros(1, device="meta").device.type == "meta"
    assert x.to(x).dtype == x.dtype
    assert torch_adapter.redirect_log().entries() == []


def test_threads_see_the_redirection():
    torch_adapter.install("cpu")
    results = []

    def worker():
        results.append(torch.randn(2, device="cuda").device.type)
        results.append(torch.ones(1).cuda().device.type)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["cpu"] * 6


def test_redirect_log_records_user_call_sites_once_each():
    session = torch_adapter.install("cpu")
    for _ in range(3):
        torch.ones(2).cuda()  # the same line three times
    line = sys._getframe().f_lineno - 1
    entries = [e for e in session.redirect_log.entries() if e.asked == "Tensor.cuda()"]
    assert len(entries) == 1
    e = entries[0]
    assert (e.file, e.line, e.count, e.became) == (HERE, line, 3, "cpu")
    assert e.function == "test_redirect_log_records_user_call_sites_once_each"
    payload = session.redirect_log.to_json()
    assert payload["schema"] == "torch-adapter.redirect-log" and payload["version"] == 2
    assert any(r["line"] == line and r["asked"] == "Tensor.cuda()" for r in payload["entries"])


def test_log_can_be_switched_off():
    session = torch_adapter.install("cpu", log_redirects=False)
    torch.ones(1).cuda()
    assert len(session.redirect_log) == 0


@pytest.mark.parametrize("policy,requested,expected", [
    ("auto", torch.float16, torch.float16),  # the program's own dtype (redirect/amp.py)
    ("auto", None, torch.float16),  # autocast('cuda')'s default
    ("auto", torch.bfloat16, torch.bfloat16),
    ("float16", torch.bfloat16, torch.float16),
    ("bfloat16", torch.float16, torch.bfloat16),
])
def test_amp_policy_on_cpu(policy, requested, expected):
    assert effective_dtype(policy, "cpu", requested) == expected
    # the AMP policy alone (dtype_policy="float16"): under the default dtype policy a CPU without
    # bf16 units runs autocast('cuda', float16) disabled, in float32 (tests/test_dtype_policy.py)
    torch_adapter.install("cpu", amp_dtype=policy, dtype_policy="float16")
    lin = torch.nn.Linear(4, 4).cuda()
    with torch.autocast("cuda", dtype=requested) if requested else torch.cuda.amp.autocast():
        assert lin(torch.randn(2, 4, device="cuda")).dtype == expected


def test_amp_policy_keeps_float16_on_accelerators():
    assert effective_dtype("auto", "npu", torch.float16) == torch.float16
    assert effective_dtype("auto", "mps", None) == torch.float16


def test_amp_float32_policy_disables_autocast_and_is_logged():
    session = torch_adapter.install("cpu", amp_dtype="float32")
    with torch.autocast("cuda", dtype=torch.float16):
        assert not torch.is_autocast_enabled("cpu")
        assert torch.nn.Linear(2, 2)(torch.randn(1, 2)).dtype == torch.float32
    rows = [e for e in session.redirect_log.entries() if e.kind == "amp"]
    assert rows and "disabled" in rows[0].became and "amp_dtype=float32" in rows[0].became


def test_grad_scaler_and_autocast_queries_answer_for_the_target():
    torch_adapter.install("cpu", dtype_policy="float16")  # float16 autocast as asked, on every CPU kind
    scaler = torch.amp.GradScaler("cuda")
    assert scaler._device == "cpu"
    with torch.autocast("cuda"):
        assert torch.is_autocast_enabled() and torch.is_autocast_enabled("cuda")
        assert torch.get_autocast_dtype("cuda") == torch.float16
    torch_adapter.configure(amp_dtype="bfloat16")
    with torch.autocast("cuda"):
        assert torch.get_autocast_dtype("cuda") == torch.bfloat16 == torch.get_autocast_dtype("cpu")


def test_configure_changes_the_amp_policy_at_once():
    torch_adapter.install("cpu")
    torch_adapter.configure(amp_dtype="float16")
    with torch.autocast("cuda"):
        assert torch.nn.Linear(2, 2)(torch.randn(1, 2)).dtype == torch.float16


@pytest.mark.parametrize("asked,target,collective,expected", [
    ("nccl", "cpu", "gloo", "gloo"),
    ("NCCL", "npu", "hccl", "hccl"),
    ("gloo", "cpu", "gloo", "gloo"),
    ("cuda:nccl,cpu:gloo", "cpu", "gloo", "cpu:gloo"),
    ("cuda:nccl,cpu:gloo", "npu", "hccl", "npu:hccl,cpu:gloo"),
    ("cuda:nccl,cpu:gloo", "xpu", "xccl", "xpu:xccl,cpu:gloo"),
    (None, "cpu", "gloo", None),
])
def test_map_backend(asked, target, collective, expected):
    assert map_backend(asked, target, collective) == expected


def test_single_process_group_with_nccl_and_ddp_device_ids(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch_adapter.install("cpu")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    try:
        assert dist.get_backend() == "gloo"
        g = dist.new_group(backend="nccl")
        assert dist.get_backend(g) == "gloo"
        model = DDP(torch.nn.Linear(2, 2).cuda(), device_ids=[0], output_device=0)
        model(torch.randn(3, 2, device="cuda")).sum().backward()
        dist.barrier(device_ids=[0])
    finally:
        dist.destroy_process_group()


def test_communication_backend_override():
    assert map_backend("nccl", "cpu", "mpi") == "mpi"


def test_env_vars_mapped_or_warned(monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with pytest.warns(AdapterEnvWarning, match="NCCL_DEBUG has no equivalent on the cpu target"):
        session = torch_adapter.install("cpu")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    asked = {e.asked: e.became for e in session.redirect_log.entries() if e.kind == "env"}
    assert asked["CUDA_LAUNCH_BLOCKING=1"].startswith("ignored")
    torch_adapter.uninstall()
    assert "GLOO_SOCKET_IFNAME" not in os.environ


def test_every_torch_cuda_name_has_a_row_in_the_table():
    missing = sorted(set(torch.cuda.__all__) - set(cuda_ns.TABLE))
    assert not missing, f"torch.cuda names without a decision: {missing}"


@pytest.mark.parametrize("name", sorted(n for n, (how, _) in cuda_ns.TABLE.items() if how.startswith("unsupported")))
def test_unsupported_cuda_names_explain_why_and_what_to_use(name):
    torch_adapter.install("cpu")
    with pytest.raises(UnsupportedCudaFeature, match=rf"torch\.cuda\.{name}: expected a CUDA device(.|\n)*Fix: "):
        value = getattr(torch.cuda, name)
        if inspect.ismodule(value):  # a module stays whole: what its factories build raises when called
            value = getattr(value, cuda_ns._DEFERRED_FACTORIES[name][0])("template <typename T> T f(T x) { return x; }")
        value()


def test_cuda_classes_stay_classes_while_installed():
    """transformers evaluates `torch.cuda.CUDAGraph | None` at import: stand-ins must be types."""
    classes = {n for n in torch.cuda.__all__ if isinstance(getattr(torch.cuda, n), type)}
    torch_adapter.install("cpu")
    still = {n for n in classes if isinstance(getattr(torch.cuda, n), type)}
    assert still == classes, sorted(classes - still)
    assert (torch.cuda.CUDAGraph | None) is not None
    import transformers  # noqa: F401  (imports modules with such annotations)
    from transformers import CLIPTextModel  # noqa: F401


# Each answered name's value is checked against its row in tests/test_cuda_table_answers.py.


def test_docs_table_is_in_sync():
    doc = open(os.path.join(os.path.dirname(HERE), "..", "docs", "cuda-namespace.md")).read()
    assert cuda_ns.table_markdown() in doc, "regenerate with: python -m torch_adapter.redirect.cuda_table > docs/cuda-namespace.md"


def test_absent_and_unknown_targets_are_clear_errors():
    if not torch.cuda.is_available():
        with pytest.raises(TargetError, match=r"target='cuda'\): expected a target present(.|\n)*Fix: use one of: .*cpu"):
            torch_adapter.install("cuda")
    with pytest.raises(TargetError, match="one of auto, cuda, npu, xpu, mps, mtia, cpu"):
        torch_adapter.install("tpu")
    with pytest.raises(TargetError, match="expected a target name"):
        torch_adapter.install(3)
    with pytest.raises(TargetError, match="simulation previews another backend"):
        torch_adapter.install("auto", simulate=True)


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError, match=r"keyword arguments among .*got 'amp_dtpye'"):
        torch_adapter.install("cpu", amp_dtpye="float16")
    with pytest.raises(UsageError, match=r"amp_dtype=...\): expected one of \(?'auto'"):
        torch_adapter.install("cpu", amp_dtype="fp8")
    with pytest.raises(UsageError, match="expected an installed adapter"):
        torch_adapter.configure(amp_dtype="float16")


def test_targets_lists_this_machine():
    rows = torch_adapter.targets(simulated=False)
    names = [r["name"] for r in rows]
    assert names[:6] == ["cuda", "npu", "xpu", "mps", "mtia", "cpu"]
    cpu = rows[names.index("cpu")]
    assert cpu["present"] and cpu["devices"] == 1 and cpu["dist_backend"] == "gloo"
    absent = [r for r in rows if not r["present"]]
    assert all(r["details"].get("reason") for r in absent)


def test_propagate_adapts_child_processes():
    torch_adapter.install("cpu", propagate=True)
    code = "import torch; print(torch.cuda.is_available(), torch.ones(1, device='cuda').device)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True cpu"
    torch_adapter.uninstall()
    assert "TORCH_ADAPTER_AUTOINSTALL" not in os.environ


def test_cuda_graph_needs_a_graph_and_graphed_callables_are_graphed():
    """Capture is emulated (tests/test_cuda_graphs.py): a bad argument is torch's TypeError."""
    torch_adapter.install("cpu")
    with pytest.raises(TypeError, match="torch.cuda.CUDAGraph"):
        torch.cuda.graph(None)
    f = torch.nn.Linear(2, 2)
    assert torch.cuda.make_graphed_callables(f, (torch.randn(1, 2),)) is f
    assert "make_graphed_callables" in str(f.forward)  # torch's graphed forward replaced it


def test_event_timing_is_real():
    torch_adapter.install("cpu")
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    import time

    time.sleep(0.02)
    b.record()
    assert 15 <= a.elapsed_time(b) < 2000
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        torch.cuda.Event().elapsed_time(torch.cuda.Event())


def test_is_cuda_stays_truthful():
    torch_adapter.install("cpu")
    x = torch.ones(1).cuda()
    assert x.is_cuda is False and x.device.type == "cpu"
    assert torch.cuda.is_available() is True


@pytest.mark.slow
def test_torch_compile_cuda_graph_modes_run_on_the_cpu_target():
    session = torch_adapter.install("cpu")
    f = torch.compile(lambda x: (x * 2).sin(), mode="reduce-overhead")
    x = torch.randn(8, device="cuda")
    torch.testing.assert_close(f(x), (x * 2).sin())
    rows = [e for e in session.redirect_log.entries() if e.kind == "compile"]
    assert rows and rows[0].asked == "torch.compile(mode='reduce-overhead')" and "'default'" in rows[0].became


def test_targets_command_lists_real_and_simulated(cli):
    res = cli("targets", "--json")
    assert res.returncode == 0, res.stderr
    import json

    rows = json.loads(res.stdout)
    sim = {r["name"]: r for r in rows if r["simulated"]}
    assert {"cuda", "mps", "mtia", "xpu", "npu"} <= set(sim)
    assert sim["mps"]["native_ops"] > 0 and sim["mps"]["dist_backend"] == "gloo"  # executes on this host
    assert sim["xpu"]["complete"] is True and sim["npu"]["complete"] is True  # the vendors' own tables
    assert sim["mtia"]["complete"] is False
    table = cli("targets")
    assert table.returncode == 0 and "simulated" in table.stdout and "mps" in table.stdout


# CI runs this file a second time as a CPU without bf16 units (TORCH_ADAPTER_CPU_FEATURES=avx2): .ci/run
pytestmark = pytest.mark.cpu_kind
