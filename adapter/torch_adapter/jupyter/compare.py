"""Run one callable under several adapter configurations, interleaved, and compare.

Configurations (see :data:`~torch_adapter.jupyter.magics.CONFIG_HELP`): ``plain`` runs
with the adapter uninstalled, ``redirect`` installed without observation, ``adapted``
installed with routing observed, ``NAME-sim`` on a simulated target (composite and
fallback routes really executed), a bare name on that real target. The session the
user had is put back afterwards.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterator

__all__ = ["compare", "configuration"]


@contextlib.contextmanager
def configuration(name: str, base_target: str = "auto") -> Iterator[None]:
    from ..routing.trace import trace
    from ..session import install, uninstall

    if name == "plain":
        uninstall()
        yield
        return
    if name.endswith("-sim"):
        install(name[:-4], simulate=True)
        with trace():
            yield
        return
    target = base_target if name in ("redirect", "adapted") else name
    install(target)
    if name == "redirect":
        yield
        return
    with trace():
        yield


def compare(fn: Callable[[], Any], configs: list[str], *, n: int = 5, warmup: int = 1,
            router: Any = None) -> dict[str, Any]:
    """Time ``fn`` under each configuration; ``kept`` is relative to the first that ran."""
    from ..session import current, suspended

    previous = current()
    base_target = "auto" if previous is None or previous.target.simulated else previous.target.name
    observing = getattr(router, "observing", None)
    if router is not None:
        router.observing = False
        router._stop()
    runs: dict[str, list[float]] = {c: [] for c in configs}
    errors: dict[str, str | None] = dict.fromkeys(configs)
    try:
        with suspended():  # the user's session is resumed intact afterwards (registrations, policy, logs)
            _interleave(fn, configs, base_target, runs, errors, n, warmup)
    finally:
        if router is not None and observing is not None:
            router.observing = observing
    baseline = next((statistics.median(runs[c]) for c in configs if runs[c]), None)
    out: dict[str, Any] = {}
    for c in configs:
        med = statistics.median(runs[c]) if runs[c] else None
        out[c] = {"runs_s": runs[c], "median_s": med, "error": errors[c],
                  "kept": (baseline / med) if (med and baseline) else None,
                  "spread": (max(runs[c]) - min(runs[c])) / med if med and len(runs[c]) > 1 else 0.0}
    return out


def _interleave(fn: Callable[[], Any], configs: list[str], base_target: str, runs: dict[str, list[float]],
                errors: dict[str, str | None], n: int, warmup: int) -> None:
    from ..session import uninstall

    try:
        for rep in range(warmup + n):
            for name in configs:
                if errors[name] is not None:
                    continue
                try:
                    with configuration(name, base_target):
                        t0 = time.perf_counter()
                        fn()
                        elapsed = time.perf_counter() - t0
                except Exception as exc:  # a configuration that cannot run this cell
                    errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                    continue
                if rep >= warmup:
                    runs[name].append(elapsed)
    finally:
        uninstall()  # the last configuration's session
