"""Shared fixtures. Every test starts and ends with no adapter installed."""

from __future__ import annotations

import itertools
import os
import socket
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


# Ports for the tests' rendezvous and servers. A port ``bind(0)`` hands out comes from the kernel's
# ephemeral range (32768-60999 here), where any outgoing connection may take it the moment the asker
# closes its probe socket, and two xdist workers asking at once raced for the same few. Each process
# counts instead through 20000-31999 (below that range), from a start its pid picks, never handing out a
# port twice, and only one it could bind just then.
_PORT_LOW, _PORT_SPAN = 20000, 12000
_ports = itertools.count((os.getpid() * 7919) % _PORT_SPAN)


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now, that no other test of this run is given (the suite's one helper)."""
    for _ in range(_PORT_SPAN):
        port = _PORT_LOW + next(_ports) % _PORT_SPAN
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"free_port: every port in {_PORT_LOW}-{_PORT_LOW + _PORT_SPAN - 1} is taken")


# Debian's (apt-get install -y chromium; .ci/run installs it); TORCH_ADAPTER_TEST_CHROMIUM names another
CHROMIUM = os.environ.get("TORCH_ADAPTER_TEST_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture
def chromium() -> str:
    """Debian's Chromium for a browser test: a skip with the reason on a developer's machine without
    it, a failure in CI (``CI`` set) — where every browser test skipping would leave the run green
    having checked no view in a browser."""
    if not Path(CHROMIUM).exists():
        why = f"{CHROMIUM} is missing: install Debian's Chromium (apt-get install -y chromium; .ci/run does it)"
        if os.environ.get("CI"):
            pytest.fail(f"CI has no browser for this test: {why}", pytrace=False)
        pytest.skip(why)
    return CHROMIUM


# every browser test's mark (the Lab tests take it from test_lab_e2e, which takes it from here)
NEEDS_CHROMIUM = pytest.mark.usefixtures("chromium")


@pytest.fixture
def cli():
    return run_cli
