"""``torch-adapter run --report``: the one-screen report a user reads in a terminal (launch/summary.py),
``--report full`` for every table, and target errors worded as run's flags. Real runs of real scripts
in fresh interpreters, read as the user reads them (stderr)."""

from __future__ import annotations

import re

import pytest

from torch_adapter.core.torch_private import can_build_extensions

FALLBACK_SCRIPT = """\
import torch
x = torch.randn(32).cuda()
with torch.autocast("cuda", dtype=torch.float16):
    y = torch.special.i0e(x)
z = (torch.nn.Linear(32, 8).cuda()(x.unsqueeze(0))).sum()
print("DEVICE", y.device, z.device)
"""


def _report_lines(stderr: str) -> list[str]:
    start = next(i for i, ln in enumerate(stderr.splitlines()) if ln.startswith("torch_adapter"))
    return stderr.splitlines()[start:]


@pytest.mark.skipif(not can_build_extensions(), reason="the emulated npu is a C++ extension: no compiler here")
def test_report_is_one_screen_with_the_fallback_and_its_line(tmp_path, cli):
    script = tmp_path / "fb.py"
    script.write_text(FALLBACK_SCRIPT)
    p = cli("run", "--target", "npu", "--emulate", "--report", str(script))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "DEVICE npu:0 npu:0" in p.stdout
    lines = _report_lines(p.stderr)
    assert len(lines) <= 40 and max(map(len, lines)) <= 100, "\n".join(lines)
    text = "\n".join(lines)
    assert re.match(r"torch_adapter on npu \(emulated\): [\d,]+ native · [\d,]+ composite · [\d,]+ CPU fallback "
                    r"op calls, [\d.]+ \w?B copied$", lines[0]), lines[0]
    assert "CPU fallbacks (ops the target lacks: copied to the CPU and back): 1 op" in text
    assert re.search(r"^  fb\.py:4: aten::special_i0e\S* ×1$", text, re.M), text  # the user's line, the op, the calls
    assert re.search(r"^      TA-F\d{3} \w", text, re.M), text  # its reason, with the reason's code first
    assert re.search(r"^redirected: \d+ CUDA requests at \d+ sites", text, re.M)
    assert re.search(r"^  fb\.py:3: autocast\('cuda', float16\) ×1 → autocast\('npu'.* \[TA-X\d{3} (same|changed)\]$",
                     text, re.M), text  # each redirect with its code and class
    assert "--fallback error" in lines[-2] and "--report full" in lines[-1]  # what to do next, in run's flags
    assert "log.table()" not in p.stderr  # no Python API in a terminal

    full = cli("run", "--target", "npu", "--emulate", "--report", "full", str(script))
    assert full.returncode == 0, full.stderr[-3000:]
    assert len(full.stderr.splitlines()) > len(lines) and "┃ op" in full.stderr and "aten::special_i0e" in full.stderr


def test_report_words_belong_to_run_not_to_the_script(tmp_path, cli):
    """``--report full`` / ``--report=full`` before SCRIPT are run's; after it, the script's own arguments."""
    script = tmp_path / "args.py"
    script.write_text("import sys, torch\ntorch.ones(2, device='cuda')\nprint('ARGS', sys.argv[1:])\n")
    p = cli("run", "--report=full", str(script), "--report", "full")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "ARGS ['--report', 'full']" in p.stdout and "┃ op" in p.stderr
    short = cli("run", "--report", str(script))  # a bare --report before SCRIPT does not take SCRIPT as its value
    assert short.returncode == 0 and "ARGS []" in short.stdout and "┃" not in short.stderr


def test_absent_target_fix_is_worded_as_runs_flags(tmp_path, cli):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    p = cli("run", "--target", "npu", str(script))
    assert p.returncode == 2 and "ran" not in p.stdout
    assert p.stderr.startswith("torch-adapter run --target npu: expected a target present on this machine")
    assert "`torch-adapter run --target npu --simulate SCRIPT`" in p.stderr
    assert "`torch-adapter run --target npu --emulate SCRIPT`" in p.stderr
    assert "install(" not in p.stderr
