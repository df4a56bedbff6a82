"""A level's unproven parts, measured on the program's own step before they are kept.

``balanced``/``aggressive`` promise speed, and on a CPU whether a part wins depends on the CPU
and the program: bf16 autocast wins 1.2–1.5× on an avx512_bf16 CPU at SD width and lost (0.86×
with the fused optimizer) on an AMX machine on the tiny-SD step; ``torch.compile`` gains 1.09× on
the tiny-SD step on an AVX2 EPYC and less where the step is one big kernel. No table of CPU kinds
can hold every program, so on a CPU target the parts whose gain depends on both — ``autocast`` (only
on CPUs with bf16/fp16 units: where bf16 is emulated it is never tried, 0.29× measured) and
``compile`` — are **tried on the program's step** (:class:`Trial`): each part in turn, on and off,
alternating ``on, off, off, on, on, off`` (a drift of the machine's load cancels), one untimed
step each way first (a compile, a first call), then kept only when its median step is at least
:data:`MARGIN` faster than without it. A part that is not kept is turned off with one warning that
says what was measured (so a level never slows a program down by more than the trial's own steps);
:func:`~torch_adapter.optimization.layer.applied` lists each decision with its medians.

A step is the time between two ``step()`` calls of the first optimizer that steps (a training
iteration: data, forward, backward, the update); a program with no optimizer (inference) is timed
per call of its model. The decision belongs to the model (kept across sessions: a benchmark that
enters ``adapted()`` per block, a notebook re-running a cell). ``TORCH_ADAPTER_TRIAL=0`` turns the
trial off (the level's parts as its table says, measured or not).
"""

from __future__ import annotations

import os
import statistics
from collections import deque
import time
import warnings
from typing import Any

__all__ = ["Trial", "MARGIN", "ORDER", "ENV", "enabled", "decisions"]

MARGIN = 0.02  # a part is kept when its median step is at least 2 % shorter than without it
ORDER = (True, False, False, True, True, False)  # timed steps per part: on/off, mirrored (abba)
ENV = "TORCH_ADAPTER_TRIAL"

_WHAT = {"autocast": "autocast({device}, {dtype})", "compile": "torch.compile of the model"}


_DECISIONS: deque[dict[str, Any]] = deque(maxlen=64)  # this process's latest decisions (benchmarks read them)


def decisions() -> list[dict[str, Any]]:
    """This process's trial decisions so far (the latest 64), oldest first, each with its level."""
    return list(_DECISIONS)


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


class Trial:
    """The on/off trial of ``parts`` (in order), for one model and one plan."""

    def __init__(self, parts: list[str], *, level: str, device: str, dtype: str | None, kind: str) -> None:
        self.parts = list(parts)
        self.level, self.device, self.dtype, self.kind = level, device, dtype, kind
        self.state = {p: True for p in self.parts}  # what the model runs now (read per call)
        self.decided: dict[str, dict[str, Any]] = {}
        self._plan = self._schedule()
        self._at = 0  # the schedule's next entry
        self._last: float | None = None  # when the step now running began
        self._running: tuple[str, bool, bool] | None = None  # (part, on, timed) of the step now running
        self._samples: dict[tuple[str, bool], list[float]] = {}
        self.optimizer: Any = None  # the optimizer whose steps are timed (a weakref)
        # the schedule starts at the first step boundary: the step a model is adopted in ran as written

    def _schedule(self) -> list[tuple[str, bool, bool]]:
        out: list[tuple[str, bool, bool]] = []
        for part in self.parts:
            out += [(part, True, False), (part, False, False)]  # untimed: each variant's first call
            out += [(part, on, True) for on in ORDER]
        return out

    @property
    def done(self) -> bool:
        return self._at > len(self._plan)

    def steps(self) -> int:
        """Steps the trial takes in all (the benchmark warms up past them)."""
        return len(self._plan) + 1

    # -- samples -----------------------------------------------------------------------------
    def step_boundary(self, optimizer: Any, now: float | None = None) -> None:
        """An optimizer's ``step()`` is about to run: the iteration since the last one ended."""
        import weakref

        if self.done:
            return
        if self.optimizer is None:
            self.optimizer = weakref.ref(optimizer)
        elif self.optimizer() is not optimizer:
            return  # a second optimizer (a GAN's): its steps are not iterations of their own
        self._tick(time.perf_counter() if now is None else now)

    def forward_done(self, seconds: float) -> None:
        """A model call without an optimizer stepping (inference): its duration is the step."""
        if self.done or self.optimizer is not None:
            return
        if self._running is not None:
            self._record(seconds)
        self._apply_next()

    def _tick(self, now: float) -> None:
        if self._last is not None and self._running is not None:
            self._record(now - self._last)
        self._last = now
        self._apply_next()

    def _record(self, seconds: float) -> None:
        part, on, timed = self._running  # type: ignore[misc]
        if timed:
            self._samples.setdefault((part, on), []).append(seconds)

    def _apply_next(self) -> None:
        if self._at >= len(self._plan):
            if self._at == len(self._plan):
                self._decide_last()
            self._running = None
            self._at = len(self._plan) + 1
            return
        part, on, timed = self._plan[self._at]
        previous = self._plan[self._at - 1][0] if self._at else None
        if previous is not None and previous != part:
            self._decide(previous)
        self.state[part] = on
        self._running = (part, on, timed)
        self._at += 1

    def _decide_last(self) -> None:
        if self._plan:
            self._decide(self._plan[-1][0])

    def _decide(self, part: str) -> None:
        if part in self.decided:
            return
        on, off = self._samples.get((part, True), []), self._samples.get((part, False), [])
        if not on or not off:
            self.state[part] = True  # nothing measured (should not happen): the level's table stands
            return
        on_s, off_s = statistics.median(on), statistics.median(off)
        kept = on_s <= off_s * (1 - MARGIN)
        self.state[part] = kept
        speedup = off_s / on_s
        self.decided[part] = {"part": part, "kept": kept, "speedup": round(speedup, 3),
                              "on_ms": round(on_s * 1e3, 2), "off_ms": round(off_s * 1e3, 2),
                              "steps": len(on) + len(off), "cpu_kind": self.kind}
        _DECISIONS.append({"level": self.level, **self.decided[part]})
        if not kept:
            what = _WHAT.get(part, part).format(device=repr(self.device), dtype=self.dtype)
            warnings.warn(
                f"torch_adapter (optimization_level={self.level!r}): {what} measured {speedup:.2f}x on this "
                f"program's step here ({on_s * 1e3:.1f} ms with it, {off_s * 1e3:.1f} ms without, "
                f"{len(on) + len(off)} alternating steps; CPU kind {self.kind}), not the {MARGIN:.0%} gain it "
                f"must show: turned off for this model. The level keeps its other parts. "
                f"({ENV}=0 keeps every part without measuring.)", _warning_class(), stacklevel=_user_level())


def _user_level() -> int:
    """The ``stacklevel`` of the program's line that ran the step (past the adapter's and torch's frames)."""
    import sys

    import torch

    from ..core.callsite import PACKAGE_DIR

    skip = (PACKAGE_DIR + os.sep, os.path.dirname(torch.__file__) + os.sep)
    frame, level = sys._getframe(2), 2  # _decide (stacklevel 1) is called by the frame 2 up from here
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def _warning_class() -> type[Warning]:
    from .levels import OptimizeWarning

    return OptimizeWarning
