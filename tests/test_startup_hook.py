"""The start-up hook (torch_adapter_autoinstall.pth + _autoinstall.activate) runs once per interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

PTH = Path(__file__).resolve().parent.parent / "adapter" / "torch_adapter_autoinstall.pth"

# One site folder reached by two spellings (as a venv's lib64 -> lib link does): CPython
# processes its .pth files once per spelling.
_TWICE = textwrap.dedent("""
    import site, sys
    site.addsitedir(sys.argv[1])
    site.addsitedir(sys.argv[2])
    import torch_adapter
    s = torch_adapter.current()
    print("installed:", None if s is None else s.target.name)
""")


def _run(tmp_path: Path, value: str) -> subprocess.CompletedProcess:
    real = tmp_path / "site-real"
    real.mkdir(exist_ok=True)
    shutil.copy(PTH, real / PTH.name)
    link = tmp_path / "site-link"
    if not link.exists():
        link.symlink_to(real, target_is_directory=True)
    env = {**os.environ, "TORCH_ADAPTER_AUTOINSTALL": value}
    return subprocess.run([sys.executable, "-c", _TWICE, str(real), str(link)], capture_output=True, text=True,
                          timeout=240, env=env)


def test_a_failure_is_reported_once_when_the_pth_is_processed_twice(tmp_path):
    done = _run(tmp_path, '{"target": "no-such-target"}')
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("could not adapt this child process") == 1, done.stderr
    assert "installed: None" in done.stdout


def test_the_adapter_is_installed_once(tmp_path):
    done = _run(tmp_path, '{"target": "cpu"}')
    assert done.returncode == 0 and "installed: cpu" in done.stdout, done.stderr
    assert "could not adapt" not in done.stderr


def test_an_unset_variable_does_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    done = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules, "
                           "'torch_adapter' in sys.modules)"], capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.split() == ["False", "False"], done.stderr
