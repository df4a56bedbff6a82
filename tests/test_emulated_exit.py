"""A program on the emulated npu that ends right after a backward exits cleanly.

torch's ``_engine_run_backward`` stashes a ``contextvars`` context in the thread-local state each
backward's GraphTask captures; the device's autograd thread can drop the GraphTask last, after the
caller's backward returned, and then needs the GIL to free that context. A program that ends inside
that window aborted: the thread met a finalizing interpreter, ``PyThread_exit_thread`` unwound
through ~GraphTask (noexcept) — 'terminate called without an active exception', exit -6, after all of
its output (CI's tests/test_device_targets.py; a core here: GraphTask -> ThreadLocalState ->
SafePyObject -> take_gil -> pthread_exit). The window is a race: with the GIL held to the end
(switch interval 100 s) and two CPU hogs, the script below aborted 10 of 40 runs without the exit
drain (``emulated._drain_autograd_threads``), 0 of 40 with it; the test runs it 10 times beside one
hog (CI's other worker is the second; without the drain it failed in one of two tries here).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from torch_adapter.core.torch_private import can_build_extensions

pytestmark = pytest.mark.skipif(not can_build_extensions(), reason="the emulated device is a C++ extension: "
                                "this machine has no C++ compiler or ninja")

SCRIPT = """
import sys, time, torch, torch_adapter
torch_adapter.install(target="npu", emulate=True)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 3)).cuda()
x = torch.randn(4, 3, 10, 10, device="cuda"); y = torch.tensor([0, 1, 2, 0], device="cuda")
print("backward", flush=True)
sys.setswitchinterval(100)  # the GIL stays with this thread to the end: the autograd thread cannot take it
torch.nn.functional.cross_entropy(model(x), y).backward()
t = time.perf_counter()
while time.perf_counter() - t < 0.3:
    pass
"""
HOG = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < 120: pass\n"
RUNS = 10
# one busy process beside the script (CI's other test worker is the second): more would slow that worker's tests
HOGS = 1


def test_exit_right_after_a_backward_is_clean(tmp_path):
    script = tmp_path / "ends_after_backward.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(HOGS)]  # the cores busy, as in CI
    try:
        for _ in range(RUNS):
            p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
            assert p.returncode == 0 and "backward" in p.stdout, f"rc={p.returncode}\n{p.stderr[-3000:]}"
    finally:
        for h in hogs:
            h.kill()
            h.wait()
