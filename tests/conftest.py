"""Shared fixtures. Every test starts and ends with no adapter installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The start-up cache (core/disk_cache.py) stays off in tests: each test computes what it checks
# (probes, profiles) itself and none reads or writes the user's ~/.cache. tests/test_startup_cache.py
# turns it on, in fresh interpreters with their own folders.
os.environ["TORCH_ADAPTER_CACHE"] = "off"

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus"


def pytest_collection_modifyitems(config, items):
    markexpr = config.getoption("-m") or ""
    if "full_sweep" in markexpr:
        return
    skip = pytest.mark.skip(reason="a long run (the full OpInfo sweep, notebook 02 in Lab): run with `pytest -m full_sweep`")
    for item in items:
        if "full_sweep" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_adapter_leaks():
    import torch_adapter

    torch_adapter.uninstall()
    yield
    torch_adapter.uninstall()


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    """`python -m torch_adapter ARGS` in a fresh interpreter (as a user runs it)."""
    # PYTHONFAULTHANDLER: a rank that dies of a signal (SIGABRT, SIGSEGV) prints every thread's Python stack
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}
    full_env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    return subprocess.run([sys.executable, "-m", "torch_adapter", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli
