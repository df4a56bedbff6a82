"""The "no fallback" gate (issue 36, item 4): a budget of CPU fallbacks in configure(), and
``torch-adapter run --max-fallbacks N --deny CODE --baseline routing.json`` failing a run that exceeds
what a team allows — on real runs of a small CUDA-written script on the simulated MPS target."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import torch_adapter
from torch_adapter.errors import FallbackError, UsageError


def test_a_fallback_budget_raises_at_the_first_op_past_it():
    x = torch.randn(8, 4)
    with torch_adapter.adapted("mps", simulate=True, max_fallbacks=1):
        torch.pdist(x.cuda())  # the one allowed
        torch.pdist(x.cuda())  # the same op again: still one
        with pytest.raises(FallbackError) as err:
            torch.linalg.eigh((x.T @ x).cuda())
    text = str(err.value)
    assert "at most 1 distinct ops on the CPU" in text and "already: aten::_pdist_forward" in text
    assert "TA-F001" in text and "configure(max_fallbacks=2)" in text
    with torch_adapter.adapted("mps", simulate=True, max_fallbacks=0, allow=["aten::_pdist_forward"]):
        torch.pdist(x.cuda())  # allowed ops are outside the budget
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(UsageError, match="max_fallbacks"):
            torch_adapter.install(target="mps", simulate=True, max_fallbacks=bad)
        assert torch_adapter.current() is None


SCRIPT = '''import os, torch
x = torch.randn(16, 8).cuda()
d = torch.pdist(x)
if os.environ.get("ADD_FALLBACK"):   # the regression a team must catch
    torch.linalg.eigh((x.T @ x))
print("done", tuple(d.shape))
'''


def _run(tmp_path, *flags: str, added: bool = False) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    if added:
        env["ADD_FALLBACK"] = "1"
    return subprocess.run([sys.executable, "-m", "torch_adapter", "run", "--target", "mps", "--simulate", *flags,
                           str(script)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


@pytest.mark.slow
def test_the_gate_fails_a_run_with_a_fallback_added_and_passes_it_against_its_baseline(tmp_path):
    # the acceptance test "no CPU fallback" fails, naming the op, its code and the line
    r = _run(tmp_path, "--max-fallbacks", "0")
    assert r.returncode == 3 and "done (120,)" in r.stdout, r.stderr
    assert "torch_adapter gate: FAILED — 1 violation (--max-fallbacks 0)" in r.stderr
    assert "1 fallbacks, --max-fallbacks allows 0: aten::_pdist_forward (TA-F001)" in r.stderr
    # a baseline taken from an accepted run; the same run passes against it
    base = _run(tmp_path, "--report-json", "routing.json")
    assert base.returncode == 0, base.stderr
    again = _run(tmp_path, "--baseline", "routing.json", "--max-fallbacks", "0")
    assert again.returncode == 0 and "torch_adapter gate: passed" in again.stderr, again.stderr
    # a fallback added on purpose: a new fallback, at its line, fails the gate against the baseline
    worse = _run(tmp_path, "--baseline", "routing.json", added=True)
    assert worse.returncode == 3, worse.stderr
    assert "new fallback: aten::_linalg_eigh ran on the CPU ×1 (TA-F001) at train.py:5 — not in the baseline" \
        in worse.stderr, worse.stderr
    assert "_pdist_forward" not in worse.stderr.split("FAILED", 1)[1]  # the baseline's own fallback passes
    # --deny by code fails on any fallback of that kind; by op only on that op
    denied = _run(tmp_path, "--deny", "TA-F001")
    assert denied.returncode == 3 and "denied: aten::_pdist_forward ran on the CPU ×1" in denied.stderr
    assert _run(tmp_path, "--deny", "aten::nonzero").returncode == 0


@pytest.mark.slow
def test_a_failing_script_keeps_its_code_and_bad_gate_input_is_a_usage_error(tmp_path):
    (tmp_path / "fails.py").write_text("import torch\ntorch.pdist(torch.randn(4, 2).cuda())\nraise SystemExit(7)\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    base = [sys.executable, "-m", "torch_adapter", "run", "--target", "mps", "--simulate"]
    r = subprocess.run([*base, "--max-fallbacks", "0", "fails.py"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 7 and "gate: FAILED" in r.stderr  # said, but the script's own failure leads
    (tmp_path / "not.json").write_text('{"schema": "something else"}')
    for flags, words in ((["--baseline", "missing.json"], "no such file"),
                         (["--baseline", "not.json"], "a torch-adapter.routing-log file"),
                         (["--deny", "TA-Q123"], "reason code of docs/reasons.md"),
                         (["--max-fallbacks", "-1"], "whole number of ops")):
        bad = subprocess.run([*base, *flags, "fails.py"], capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=300)
        assert bad.returncode == 2 and words in bad.stderr, (flags, bad.stderr)
