"""Two CLI probes of issue 39, with real processes (no mocks):

* `torch-adapter run -m no_such_module` printed runpy's frames (`run_module` ->
  `_get_module_details`) where `python -m no_such_module` prints one line: now one line too,
  naming `torch-adapter run`, exit 1 as python's;
* a symlink loop given to `torch-adapter check --path LOOP` was reported as "does not exist":
  now named as a loop of symbolic links, as `torch-adapter run LOOP` names it, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import run_cli


def _plain(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    return subprocess.run([sys.executable, *args], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_run_m_of_a_missing_module_is_one_line_like_python(tmp_path):
    plain = _plain("-m", "no_such_module", cwd=tmp_path)
    assert plain.stderr.strip() == f"{sys.executable}: No module named no_such_module", plain.stderr
    done = run_cli("run", "-m", "no_such_module", cwd=tmp_path, timeout=120)
    assert done.returncode == plain.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("torch-adapter run -m no_such_module: "), lines[0]
    assert "no_such_module" in lines[0] and "importable" in lines[0], lines[0]
    assert "Traceback" not in done.stderr and "runpy" not in done.stderr, done.stderr
    assert done.stdout == "", done.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges there")
@pytest.mark.parametrize("how", ["--path", "positional", "python -m torch_adapter.check"])
def test_check_names_a_symlink_loop_as_run_does(tmp_path, how):
    (tmp_path / "loop").symlink_to("loop")
    ran = run_cli("run", "loop", cwd=tmp_path, timeout=120)
    assert ran.returncode == 2 and "a loop of symbolic links" in ran.stderr, ran.stderr  # run's wording
    if how == "python -m torch_adapter.check":
        done = _plain("-m", "torch_adapter.check", "--path", "loop", cwd=tmp_path)
    else:
        done = run_cli("check", *(["--path", "loop"] if how == "--path" else ["loop"]), cwd=tmp_path, timeout=120)
    err = done.stderr
    assert done.returncode == 2, err
    assert "does not exist" not in err, err
    assert "torch-adapter check: expected an existing folder or file, got 'loop'" in err, err
    assert "a loop of symbolic links: 'loop' -> 'loop'" in err, err
    assert "Traceback" not in err, err
