"""What the real-program acceptance run's case modules share: the launch commands, the ``Case``
record, output checks, the metrics compared between targets and the case-folder naming (run.py and
cases_machinery.py use it)."""

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
RUN = [PY, "-m", "torch_adapter", "run"]  # run.py appends the pass's target flags (set_target_flags)
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
    # what is compared between targets: (work, output) -> the values the program printed (losses, a metric,
    # generated text) or a digest of what it wrote; None: nothing the program prints is comparable
    metric: Callable[[Path, str], list] | None = None
    metric_note: str = ""  # what the metric is, or why there is none
    artifacts: tuple = ()  # globs (case folder) of what the program wrote, compared between targets
    deterministic: bool = True  # False: two runs on one target differ (unseeded ranks, racing processes)

    def compares(self, metric=None, note: str = "", artifacts: tuple = (), deterministic: bool = True) -> "Case":
        """This case with what is compared between targets (run.py's and cases_machinery.py's tables)."""
        self.metric, self.metric_note, self.artifacts, self.deterministic = metric, note, artifacts, deterministic
        return self


def set_target_flags(flags: list[str]) -> None:
    """Every ``torch_adapter run`` the cases start from now on gets ``flags`` (``--target npu --emulate``):
    RUN is extended in place (the case modules hold this very list)."""
    RUN[4:] = list(flags)


def with_target_flags(cmd: list[str], flags: list[str]) -> list[str]:
    """``cmd`` with ``flags`` after each ``torch_adapter run`` that lacks them (``torchrun … -m torch_adapter
    run SCRIPT``, which the cases spell without RUN)."""
    out: list[str] = []
    i = 0
    while i < len(cmd):
        out.append(cmd[i])
        if cmd[i] == "run" and i >= 1 and cmd[i - 1] == "torch_adapter" and cmd[i + 1:i + 1 + len(flags)] != flags:
            out.extend(flags)
        i += 1
    return out


class Printed(float):
    """A number read from a program's output, with the text it was printed as (its last digit's unit)."""

    text: str

    def __new__(cls, text: str) -> "Printed":
        self = super().__new__(cls, text)
        self.text = text
        return self


def floats(pattern: str, flags: int = 0, *, ranks: bool = False) -> Callable[[Path, str], list]:
    """A metric: every match of ``pattern``'s groups in the output, as numbers, in order (``ranks``: sorted —
    several processes print into one output, in an order that depends on timing)."""
    rx = re.compile(pattern, flags)

    def metric(work: Path, out: str) -> list:
        values = [Printed(v) for m in rx.findall(out) for v in ((m,) if isinstance(m, str) else m) if v != ""]
        return sorted(values) if ranks else values
    return metric


def keyed(pattern: str, flags: int = 0) -> Callable[[Path, str], list]:
    """A metric from a redrawn progress bar: ``pattern``'s groups ``step`` and ``value``; the last value shown for
    each step, in step order (how often tqdm redraws a step depends on timing, its last value does not)."""
    rx = re.compile(pattern, flags)

    def metric(work: Path, out: str) -> list:
        last: dict[str, Printed] = {}
        for m in rx.finditer(out):
            last[m.group("step")] = Printed(m.group("value"))
        return [last[k] for k in sorted(last, key=lambda k: (len(k), k))]
    return metric


def texts(pattern: str, flags: int = 0) -> Callable[[Path, str], list]:
    """A metric: every match of ``pattern``'s first group in the output, as text (generated samples)."""
    rx = re.compile(pattern, flags)
    return lambda work, out: [m.strip() for m in rx.findall(out)]


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
