"""The emulated npu (torch_adapter/emulated): a real PrivateUse1 device, and the adapter's real-target
path on it.

The device is process-wide and cannot be taken back (torch renames PrivateUse1 once), so every
check runs in a fresh interpreter: nothing here starts it in the pytest process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from torch_adapter.core.torch_private import can_build_extensions

pytestmark = pytest.mark.skipif(not can_build_extensions(), reason="the emulated device is a C++ extension: "
                                "this machine has no C++ compiler or ninja")


def run_py(code: str, *, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
    full.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=timeout)


def results(code: str, **kw) -> dict:
    """Run ``code`` (which prints one JSON line starting with RESULT ) and return that object."""
    p = run_py(code, **kw)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"rc={p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


START = """
import json, torch, torch_adapter
from torch_adapter.routing import profiles
from torch_adapter import emulated
em = emulated.start("npu", profiles.load_profile("npu").native)
out = {}
def done():
    print("RESULT " + json.dumps(out, default=str))
"""


def test_a_device_of_its_own_type():
    r = results(START + """
x = torch.randn(4, 5, device="npu")
out["device"] = str(x.device); out["type"] = x.device.type; out["is_npu"] = x.is_npu
out["accelerator"] = str(torch.accelerator.current_accelerator())
out["module"] = [torch.npu.is_available(), torch.npu.device_count(), torch.npu.current_device()]
y = x.cpu(); out["copy_back"] = torch.equal(y, x.cpu()) and y.device.type == "cpu"
out["storage"] = str(x.untyped_storage().device)
m = torch.nn.Linear(5, 3).npu()
out["param"] = str(m.weight.device)
try:
    x + torch.randn(4, 5)
except RuntimeError as e:
    out["mixed"] = str(e)
out["scalar_ok"] = str((x + torch.tensor(2.0)).device)
out["index_host"] = list(x[torch.tensor([0, 2])].shape)
out["amp"] = [str(d) for d in torch.npu.get_amp_supported_dtype()]; out["bf16"] = torch.npu.is_bf16_supported()
done()
""")
    assert r["device"] == "npu:0" and r["type"] == "npu" and r["is_npu"] is True
    assert r["accelerator"] == "npu" and r["module"] == [True, 1, 0]
    assert r["copy_back"] and r["storage"] == "npu:0" and r["param"] == "npu:0"
    assert "Expected all tensors to be on the same device" in r["mixed"] and "cpu" in r["mixed"]
    assert r["scalar_ok"] == "npu:0" and r["index_host"] == [2, 5]
    assert "torch.float16" in r["amp"] and r["bf16"] is True


def test_memory_stats_come_from_the_devices_allocator():
    r = results(START + """
torch.npu.reset_peak_memory_stats()
base = torch.npu.memory_allocated()
x = torch.empty(1000, dtype=torch.float32, device="npu")
out["after"] = torch.npu.memory_allocated() - base
y = x * 2  # a device kernel's output: the host kernel's memory, adopted by the device
out["kernel_output"] = torch.npu.memory_allocated() - base
del x, y
out["freed"] = torch.npu.memory_allocated() - base
out["peak"] = torch.npu.max_memory_allocated() - base
out["host_unaffected"] = torch.npu.memory_allocated() == base
done()
""")
    assert r["after"] == 4000 and r["kernel_output"] == 8000 and r["freed"] == 0 and r["peak"] >= 8000


def test_device_kernels_compute_on_the_devices_memory_and_fallbacks_really_copy():
    r = results(START + """
x = torch.randn(64, device="npu")
ptr = x.data_ptr(); x.mul_(2); out["inplace_same_memory"] = x.data_ptr() == ptr   # native: no copy
v = x.view(8, 8)[2:4]; v.zero_(); out["view_writes_base"] = bool((x[16:32] == 0).all())
o = torch.empty(0, device="npu"); torch.add(x, x, out=o); out["out_resized"] = [list(o.shape), str(o.device)]
before = emulated.fallback_counts()
h = torch.special.i0e(x)                        # not in the vendor's table: the fallback
out["fallback_device"] = str(h.device)
out["fallback_value"] = torch.allclose(h.cpu(), torch.special.i0e(x.cpu()))
after = emulated.fallback_counts()
calls, ns, to_host, back = after["aten::special_i0e.out"]
out["fallback_counts"] = [calls, to_host, back, ns > 0]
y = torch.randn(8, device="npu"); torch.special.i0e(y, out=y)    # out= on the fallback: written back in place
out["fallback_inplace"] = str(y.device)
out["native_not_counted"] = "aten::mul_.Tensor" not in after
done()
""")
    assert r["inplace_same_memory"] and r["view_writes_base"] and r["out_resized"] == [[64], "npu:0"]
    assert r["fallback_device"] == "npu:0" and r["fallback_value"]
    # torch's fallback copies every tensor argument to the host (the input and the out= tensor the
    # functional op made: 2 x 64 floats) and writes the out= tensor back (64 floats)
    assert r["fallback_counts"] == [1, 512, 256, True]
    assert r["fallback_inplace"] == "npu:0" and r["native_not_counted"]


def test_rng_streams_events_autocast_serialization_pinned():
    r = results(START + """
import io
torch.manual_seed(7); a = torch.randn(5, device="npu"); torch.manual_seed(7); b = torch.randn(5)
out["same_as_host"] = torch.equal(a.cpu(), b)   # the device's default generator is the host's
state = torch.npu.get_rng_state(); c = torch.rand(3, device="npu"); torch.npu.set_rng_state(state)
out["state_roundtrip"] = torch.equal(c.cpu(), torch.rand(3, device="npu").cpu())
g = torch.Generator("npu"); g.manual_seed(1); out["gen_device"] = str(g.device)
s = torch.npu.Stream(); out["stream"] = [isinstance(s, torch.npu.Stream), s.device.type]
e1, e2 = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
e1.record(); torch.mm(torch.randn(64, 64, device="npu"), torch.randn(64, 64, device="npu")); e2.record()
e2.synchronize(); out["elapsed"] = e1.elapsed_time(e2) >= 0
lin = torch.nn.Linear(8, 4).npu(); x = torch.randn(2, 8, device="npu")
with torch.autocast("npu", dtype=torch.float16):
    out["autocast"] = str(lin(x).dtype)
scaler = torch.amp.GradScaler("npu"); opt = torch.optim.SGD(lin.parameters(), lr=0.1)
with torch.autocast("npu", dtype=torch.float16):
    loss = lin(x).float().pow(2).mean()
scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); out["scaler"] = scaler.get_scale() > 0
buf = io.BytesIO(); torch.save({"w": lin.state_dict(), "x": x}, buf)
buf.seek(0); d = torch.load(buf); out["load"] = [str(d["x"].device), torch.equal(d["x"].cpu(), x.cpu())]
buf.seek(0); d = torch.load(buf, map_location="cpu"); out["map_location"] = str(d["w"]["weight"].device)
p = torch.randn(16).pin_memory(); out["pinned"] = p.is_pinned()
q = p.to("npu", non_blocking=True); torch.npu.synchronize(); out["non_blocking"] = [str(q.device), torch.equal(q.cpu(), p)]
done()
""")
    assert r["same_as_host"] and r["state_roundtrip"] and r["gen_device"] == "npu:0"
    assert r["stream"] == [True, "npu"] and r["elapsed"]
    assert r["autocast"] == "torch.float16" and r["scaler"]
    assert r["load"] == ["npu:0", True] and r["map_location"] == "cpu"
    assert r["pinned"] is True and r["non_blocking"] == ["npu:0", True]


TRAIN = """
import json, sys, torch, torch_adapter
target = sys.argv[1]
torch_adapter.install(target=target, **({"emulate": True} if target == "npu" else {}))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GroupNorm(2, 8), torch.nn.SiLU(),
                            torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 4)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.cuda.amp.GradScaler()
x = torch.randn(4, 3, 8, 8).cuda(); y = torch.tensor([0, 1, 2, 3]).cuda()
losses = []
for _ in range(3):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); opt.zero_grad()
    losses.append(loss.item())
with torch_adapter.trace() as log:
    model(x).sum().backward()
print("RESULT " + json.dumps({"losses": losses, "device": str(next(model.parameters()).device),
                              "is_cuda": x.is_cuda, "label": torch_adapter.current().target.label,
                              "summary": log.summary(), "cuda_count": torch.cuda.device_count(),
                              "mem": torch.cuda.memory_allocated() > 0}))
"""


def test_cuda_written_training_runs_unchanged_with_the_cpu_targets_losses(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out = {}
    for target in ("cpu", "npu"):
        p = subprocess.run([sys.executable, str(script), target], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and lines, p.stderr[-4000:]
        out[target] = json.loads(lines[-1][7:])
    npu, cpu = out["npu"], out["cpu"]
    assert npu["device"] == "npu:0" and npu["label"] == "npu (emulated)" and npu["is_cuda"] is False
    assert cpu["device"] == "cpu"
    assert npu["losses"] == pytest.approx(cpu["losses"], rel=1e-5, abs=1e-6)
    assert npu["summary"]["native"] > 0 and npu["cuda_count"] == 1 and npu["mem"]


def test_run_cli_reports_emulated_fallbacks_with_bytes(tmp_path, cli):
    script = tmp_path / "fb.py"
    script.write_text("import torch\nx = torch.randn(32).cuda()\ny = torch.special.i0e(x)\n"
                      "print('DEVICE', y.device)\n")
    report = tmp_path / "r.json"
    p = cli("run", "--target", "npu", "--emulate", "--report", "--report-json", str(report), str(script))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "DEVICE npu:0" in p.stdout
    data = json.loads(report.read_text())
    text = json.dumps(data)
    assert "emulated" in (p.stdout + p.stderr + text)
    rows = [r for r in data["ops"] if r["op"].startswith("aten::special_i0e") and r["route"] == "fallback"]
    assert rows and sum(r["bytes_copied"] for r in rows) == 384  # 2 x 32 floats to the host, 32 back


def test_bad_input_names_the_target_and_the_fix(tmp_path):
    r = results("""
import json, torch_adapter
out = {}
for kw in ({"target": "mps", "emulate": True}, {"target": "npu", "emulate": True, "simulate": True},
           {"target": "auto", "emulate": True}, {"target": "npu", "emulate": "yes"}):
    try:
        torch_adapter.install(**kw)
        out[repr(kw)] = "installed"
    except Exception as e:
        out[repr(kw)] = type(e).__name__ + ": " + str(e)
out["after"] = torch_adapter.current() is None
import torch
out["privateuse1"] = torch._C._get_privateuse1_backend_name()
print("RESULT " + json.dumps(out))
""")
    mps = r[repr({"target": "mps", "emulate": True})]
    assert mps.startswith("TargetError") and "built into torch" in mps and "simulate=True" in mps
    both = r[repr({"target": "npu", "emulate": True, "simulate": True})]
    assert "emulate or simulate, not both" in both
    assert "npu" in r[repr({"target": "auto", "emulate": True})]
    assert r[repr({"target": "npu", "emulate": "yes"})].startswith("UsageError")
    assert r["after"] is True and r["privateuse1"] == "privateuseone"  # nothing was started


def test_a_real_torch_npu_beside_it_is_refused(tmp_path):
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("")  # an installed torch_npu, as find_spec sees it
    r = results("""
import json, torch_adapter
try:
    torch_adapter.install(target="npu", emulate=True); msg = "installed"
except Exception as e:
    msg = type(e).__name__ + ": " + str(e)
print("RESULT " + json.dumps({"msg": msg}))
""", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert r["msg"].startswith("TargetError") and "torch_npu is installed" in r["msg"]
    assert "install(target='npu') without emulate" in r["msg"]


def test_a_failed_build_is_one_error_and_installs_nothing(tmp_path):
    broken = tmp_path / "cxx"
    broken.write_text("#!/bin/sh\necho 'fake.cpp:1:1: error: no compiler today' >&2\nexit 1\n")
    broken.chmod(0o755)
    r = results("""
import json, torch, torch_adapter
try:
    torch_adapter.install(target="npu", emulate=True); msg = "installed"
except Exception as e:
    msg = type(e).__name__ + ": " + str(e)
print("RESULT " + json.dumps({"msg": msg, "session": torch_adapter.current() is None,
                              "cuda": torch.cuda.is_available(),
                              "pu1": torch._C._get_privateuse1_backend_name()}))
""", env={"CXX": str(broken), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
         "TORCH_ADAPTER_PACKAGED_BUILDS": "off"})
    assert r["msg"].startswith("TargetError") and "error: no compiler today" in r["msg"]
    assert "python -m torch_adapter.emulated build --verbose" in r["msg"]
    assert r["session"] and r["cuda"] is False and r["pu1"] == "privateuseone"


def test_emulated_and_simulated_npu_agree_op_for_op(tmp_path):
    """The emulated device executes the vendor table's routing; the simulated preview labels it. Every op
    both runs see must get the same route (a disagreement is a defect of one side)."""
    script = tmp_path / "routes.py"
    script.write_text(textwrap.dedent("""
        import json, sys, torch, torch_adapter
        if sys.argv[1] == "sim":
            torch_adapter.install(target="npu", simulate=True)
        else:
            torch_adapter.install(target="npu", emulate=True)
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GroupNorm(2, 8), torch.nn.SiLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).cuda()
        att = torch.nn.MultiheadAttention(16, 2, batch_first=True).cuda()
        opt = torch.optim.AdamW(list(m.parameters()) + list(att.parameters()), lr=1e-3, foreach=False)
        x = torch.randn(2, 3, 8, 8, device="cuda"); h = torch.randn(2, 5, 16, device="cuda")
        with torch_adapter.trace() as log:
            a, _ = att(h, h, h)
            loss = torch.nn.functional.cross_entropy(m(x), torch.tensor([1, 2], device="cuda")) + a.pow(2).mean()
            loss = loss + torch.logcumsumexp(a, 1).mean() + torch.special.i0e(a).mean()
            loss.backward(); opt.step()
            torch.topk(a.flatten(), 3); torch.nonzero(a > 0)
        routes = {}
        for r in log.table():
            routes.setdefault(r["op"], set()).add(r["route"])
        print("RESULT " + json.dumps({"routes": {k: sorted(v) for k, v in routes.items()}, "loss": loss.item()}))
    """))
    got = {}
    for mode in ("sim", "emu"):
        p = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=300)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and lines, p.stderr[-4000:]
        got[mode] = json.loads(lines[-1][7:])
    sim, emu = got["sim"]["routes"], got["emu"]["routes"]
    common = set(sim) & set(emu)
    assert len(common) > 40
    differ = {op: (sim[op], emu[op]) for op in sorted(common) if sim[op] != emu[op]}
    assert differ == {}
    assert "fallback" in emu["aten::_logcumsumexp"]
    assert got["sim"]["loss"] == pytest.approx(got["emu"]["loss"], rel=1e-5)


def test_torch_device_of_an_int_is_decided_per_caller():
    """``torch.device(0)`` is ``cuda:0`` to the program (mapped where it is used), but torch's own code
    gets torch's answer — the machine's accelerator — on a real accelerator (here the emulated npu),
    and ``cuda:0`` only where this torch has none (the CPU target). Issue 39: it was cuda:0 for everyone."""
    r = results("""
import json, torch, torch_adapter
TORCH_SIDE = "def ask(i):\\n    return str(torch.device(i))\\n"
def torch_side():  # a function whose module is torch's, as torch.nn.parallel's would be
    scope = {"__name__": "torch._adapter_probe", "torch": torch}
    exec(TORCH_SIDE, scope)
    return scope["ask"]
out = {}
with torch_adapter.adapted("cpu"):
    out["cpu_program"], out["cpu_torch"] = str(torch.device(0)), torch_side()(0)
torch_adapter.install(target="npu", emulate=True)
out["npu_program"], out["npu_torch"] = str(torch.device(0)), torch_side()(0)
out["npu_used"] = str(torch.ones(1, device=torch.device(0)).device)
torch_adapter.uninstall()
print("RESULT " + json.dumps(out))
""")
    assert r == {"cpu_program": "cuda:0", "cpu_torch": "cuda:0", "npu_program": "cuda:0", "npu_torch": "npu:0",
                 "npu_used": "npu:0"}, r
