"""The redirect surface on both kinds of target: the CPU target ("cuda" is the host) and the emulated
npu (a real device of its own type, torch_adapter/emulated) — the same CUDA-written code, the same
expected answers, except where the device is really another one (then each target's truth).

Each case runs in a fresh interpreter per target: the emulated device is process-wide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from torch_adapter.core.torch_private import can_build_extensions

TARGETS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("npu", id="npu-emulated", marks=pytest.mark.skipif(
        not can_build_extensions(), reason="the emulated npu is a C++ extension: no C++ compiler or ninja here")),
]

PRELUDE = """
import json, sys, torch, torch_adapter
TARGET = sys.argv[1]
session = torch_adapter.install(target=TARGET, **({"emulate": True} if TARGET == "npu" else {}))
DEV = "cpu" if TARGET == "cpu" else "npu"
out = {}
"""


def run_case(target: str, body: str, tmp_path) -> dict:
    script = tmp_path / f"case_{target}.py"
    script.write_text(PRELUDE + textwrap.dedent(body) + '\nprint("RESULT " + json.dumps(out, default=str))\n')
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    p = subprocess.run([sys.executable, str(script), target], capture_output=True, text=True, timeout=300,
                       env=env, cwd=tmp_path)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("target", TARGETS)
def test_device_requests_land_on_the_target(target, tmp_path):
    r = run_case(target, """
    out["factories"] = [torch.zeros(2, device="cuda").device.type, torch.randn(2, device="cuda:0").device.type,
                        torch.ones(2, device=torch.device("cuda")).device.type, torch.empty(1, device=0).device.type]
    out["moves"] = [torch.ones(2).cuda().device.type, torch.ones(2).to("cuda").device.type,
                    torch.ones(2).to(0).device.type, torch.ones(2).to(device="cuda", dtype=torch.float64).dtype]
    m = torch.nn.Linear(3, 2).cuda(); m2 = torch.nn.Linear(3, 2).to("cuda:0")
    out["module"] = [next(m.parameters()).device.type, next(m2.parameters()).device.type]
    x = torch.ones(2).cuda()
    out["is_cuda"] = x.is_cuda
    out["back"] = x.cpu().device.type
    with torch.device("cuda"):
        out["context"] = torch.empty(1).device.type
    out["like"] = torch.zeros_like(x).device.type
    """, tmp_path)
    dev = "cpu" if target == "cpu" else "npu"
    assert r["factories"] == [dev] * 4 and r["moves"][:3] == [dev] * 3 and r["moves"][3] == "torch.float64"
    assert r["module"] == [dev, dev] and r["back"] == "cpu" and r["context"] == dev and r["like"] == dev
    assert r["is_cuda"] is False  # truthful: the tensor is not on a CUDA device (docs/redirect.md)


@pytest.mark.parametrize("target", TARGETS)
def test_cuda_namespace_answers_for_the_target(target, tmp_path):
    r = run_case(target, """
    c = torch.cuda
    out["avail"] = [c.is_available(), c.device_count(), c.current_device()]
    c.set_device(0); c.synchronize()
    c.reset_peak_memory_stats()
    a0 = c.memory_allocated()
    big = torch.empty(1 << 20, device="cuda")
    out["mem_grew"] = c.memory_allocated() - a0 >= 4 << 20 and c.max_memory_allocated() >= c.memory_allocated()
    del big
    c.empty_cache()
    c.manual_seed(3); a = torch.randn(4, device="cuda"); c.manual_seed(3); b = torch.randn(4, device="cuda")
    out["seeded"] = torch.equal(a.cpu(), b.cpu())
    state = c.get_rng_state(); a = torch.rand(3, device="cuda"); c.set_rng_state(state)
    out["rng_state"] = torch.equal(a.cpu(), torch.rand(3, device="cuda").cpu())
    e1, e2 = c.Event(enable_timing=True), c.Event(enable_timing=True)
    e1.record(); torch.mm(torch.randn(32, 32, device="cuda"), torch.randn(32, 32, device="cuda")); e2.record()
    e2.synchronize(); out["elapsed"] = e1.elapsed_time(e2) >= 0
    s = c.Stream()
    with c.stream(s):
        y = torch.ones(3, device="cuda") * 2
    c.current_stream().wait_stream(s)
    out["stream_result"] = y.sum().item()
    out["props"] = bool(c.get_device_name(0)) and c.get_device_properties(0).total_memory > 0
    out["bf16"] = c.is_bf16_supported()
    out["accelerator"] = str(torch.accelerator.current_accelerator())
    """, tmp_path)
    assert r["avail"] == [True, 1, 0] and r["mem_grew"] and r["seeded"] and r["rng_state"]
    assert r["elapsed"] and r["stream_result"] == 6.0 and r["props"] and r["bf16"] is True
    # every target answers the program "cuda" (a CUDA-written program takes its CUDA path, redirected:
    # docs/cuda-namespace.md); torch's own callers get the device (tests/test_emulated_porting.py)
    assert r["accelerator"] == "cuda"


@pytest.mark.parametrize("target", TARGETS)
def test_amp_training_step_and_checkpoint(target, tmp_path):
    r = run_case(target, """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(8, 16, device="cuda"); y = torch.randint(0, 4, (8,), device="cuda")
    losses = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    out["losses"] = losses
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "ckpt.pt")
    ck = torch.load("ckpt.pt", map_location="cuda:0")
    out["ckpt_device"] = ck["model"]["0.weight"].device.type
    ck2 = torch.load("ckpt.pt", map_location=lambda s, loc: s.cuda())
    out["ckpt_fn"] = ck2["model"]["0.weight"].device.type
    model.load_state_dict(torch.load("ckpt.pt", map_location="cpu")["model"])
    out["reloaded"] = next(model.parameters()).device.type
    """, tmp_path)
    dev = "cpu" if target == "cpu" else "npu"
    assert r["ckpt_device"] == dev and r["ckpt_fn"] == dev and r["reloaded"] == dev
    assert r["losses"][2] < r["losses"][0]


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
def test_losses_agree_between_the_two_targets(tmp_path, amp):
    """The same seeded CUDA-written step on both targets: the same numbers in float32 (the emulated
    device computes with the host's kernels and draws from the host's generator). Under autocast each
    target applies its own op lists — the CPU's autocast on the CPU target, the device's (CUDA's lists)
    on the npu — so bfloat16 steps agree to bfloat16's precision, not bit for bit."""
    if not can_build_extensions():
        pytest.skip("the emulated npu is a C++ extension: no C++ compiler or ninja here")
    body = f"    AMP = {amp}\n" + """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 3)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 3, 10, 10, device="cuda"); y = torch.tensor([0, 1, 2, 0], device="cuda")
    out["losses"] = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=AMP):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
        out["losses"].append(loss.item())
    out["running_mean"] = model[1].running_mean.cpu().tolist()
    """
    cpu, npu = run_case("cpu", body, tmp_path), run_case("npu", body, tmp_path)
    tol = 2e-2 if amp else 1e-6
    assert npu["losses"] == pytest.approx(cpu["losses"], rel=tol)
    assert npu["running_mean"] == pytest.approx(cpu["running_mean"], rel=tol, abs=tol if amp else 1e-7)


@pytest.mark.parametrize("target", TARGETS)
def test_dataloader_pinned_batches_and_non_blocking_copies(target, tmp_path):
    r = run_case(target, """
    ds = torch.utils.data.TensorDataset(torch.randn(12, 4), torch.arange(12))
    dl = torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True)
    seen = []
    for xb, yb in dl:
        xb = xb.cuda(non_blocking=True); yb = yb.to("cuda", non_blocking=True)
        seen.append((xb.device.type, int(yb.sum().item())))
    torch.cuda.synchronize()
    out["batches"] = seen
    """, tmp_path)
    dev = "cpu" if target == "cpu" else "npu"
    assert [d for d, _ in r["batches"]] == [dev] * 3 and sum(s for _, s in r["batches"]) == sum(range(12))


@pytest.mark.parametrize("target", TARGETS)
def test_a_tensor_left_on_the_host_is_the_targets_truth(target, tmp_path):
    """The device mistake the CPU target cannot show: on the emulated npu it raises torch's own error."""
    r = run_case(target, """
    w = torch.randn(4, 4).cuda()
    bias = torch.randn(4)           # forgot .cuda()
    try:
        out["result"] = str((w @ w + bias).device)
    except RuntimeError as e:
        out["error"] = str(e)
    """, tmp_path)
    if target == "cpu":
        assert r["result"] == "cpu"  # "cuda" is the host: the mistake is legal there
    else:
        assert "Expected all tensors to be on the same device" in r["error"]
