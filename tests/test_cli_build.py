"""``torch-adapter build``: every C++ part compiled ahead, so no program or notebook cell compiles one
(a fresh machine's first ``%adapter`` cell printed "compiling the C++ op observer" on stderr: CI's
JupyterLab tutorial test, when no earlier test had built it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torch_adapter.cli.build import PARTS
from torch_adapter.core.torch_private import can_build_extensions, extension_build_dir


def _build(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch_adapter", "build", *args], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.mark.skipif(not can_build_extensions(), reason="no C++ compiler or ninja here")
def test_build_compiles_a_part_once_into_torchs_extension_cache(tmp_path):
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "TORCH_ADAPTER_PACKAGED_BUILDS": "off"}
    first = _build("--only", "dtype-guard", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("dtype-guard: built (") and "compiling" not in first.stdout
    from torch_adapter.routing import dtype_guard

    folder = tmp_path / extension_build_dir(dtype_guard._name()).name
    assert list(folder.glob("*.so")), list(tmp_path.iterdir())
    again = _build("--only", "dtype-guard", env=env)
    assert again.returncode == 0 and again.stdout.startswith("dtype-guard: already built (")


def test_every_part_is_listed_and_a_part_that_cannot_build_fails_the_command(tmp_path):
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "CXX": str(tmp_path / "no-such-compiler"),
           "TORCH_ADAPTER_PACKAGED_BUILDS": "off"}
    r = _build("--only", "dtype-guard", "--only", "half-gate", env=env)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["dtype-guard", "half-gate"], r.stderr
    assert all("FAILED" in ln and "compiler" in ln for ln in lines), r.stderr
    assert set(PARTS) == {"observer", "dtype-guard", "half-gate", "emulated"}
    usage = _build("--only", "nope", env=env)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
