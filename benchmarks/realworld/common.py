"""What the real-program acceptance run's case modules share: the launch commands, the ``Case``
record, output checks and the case-folder naming (run.py and cases_machinery.py use it)."""

from __future__ import annotations

import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PY = sys.executable
RUN = [PY, "-m", "torch_adapter", "run"]
TORCHRUN2 = ["torchrun", "--standalone", "--nproc-per-node", "2"]


@dataclass
class Case:
    name: str
    repo: str
    build: Callable[[Path, Path], tuple[list[str], Path]]  # (checkout, work) -> (argv, cwd)
    check: Callable[[Path, str], str | None] = lambda work, out: None  # error text or None
    timeout: int = 900
    extra_path: bool = False  # the checkout itself on PYTHONPATH (timm)
    with_repos: tuple = ()  # other checkouts the program imports, put on PYTHONPATH (DiT imports timm)
    env: dict = field(default_factory=dict)  # extra environment; "{work}" in a value is the case folder
    paths: tuple = ()  # put first on PYTHONPATH: a relative one is a harness folder here (tiktoken_shim), "{work}" the case folder


def expect(pattern: str, path: str | None = None):
    """A check: the output matches PATTERN (and the case folder holds PATH)."""
    def check(work: Path, out: str) -> str | None:
        if path and not (work / path).exists():
            return f"missing {work / path}"
        return None if re.search(pattern, out) else f"output lacks /{pattern}/"
    return check


def slug(name: str) -> str:
    """A case's folder name under --work."""
    return re.sub(r"[^\w]+", "_", name)[:60]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
