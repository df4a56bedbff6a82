"""Run one callable under several adapter configurations, interleaved, and compare.

Configurations (see :data:`~torch_adapter.jupyter.magics.CONFIG_HELP`): ``plain`` runs
with the adapter uninstalled, ``redirect`` installed without observation, ``adapted``
installed with routing observed, ``NAME-sim`` on a simulated target (composite and
fallback routes really executed), a bare name on that real target. The session the
user had is put back afterwards.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from typing import Any, Callable, Iterator

__all__ = ["compare", "configuration", "summarize", "verdict"]


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


# A comparison is a measurement: interleaved rounds (the order rotated each round, so no configuration
# always runs first after the others' set-up), warm-up rounds discarded, at least ``n`` rounds and
# ``min_time_s`` of timed runs, then per configuration the median and quartiles of its runs, and for the
# ratio to the baseline a bootstrap interval (the runs resampled, medians compared, a fixed seed: the same
# runs give the same interval). A verdict is given only where the measurement resolves it.
BOOTSTRAP = 2000
CONFIDENCE = 0.95
MAX_ROUNDS = 200


def compare(fn: Callable[[], Any], configs: list[str], *, n: int = 5, warmup: int = 1, min_time_s: float = 1.0,
            max_rounds: int = MAX_ROUNDS, router: Any = None) -> dict[str, Any]:
    """Time ``fn`` under each configuration, interleaved; every figure is relative to the first
    configuration that ran (the baseline). Each row: ``runs_s`` (the timed runs), ``median_s``,
    ``q1_s``/``q3_s`` (quartiles), ``kept`` (baseline median / median: throughput kept),
    ``kept_low``/``kept_high`` (its 95 % bootstrap interval), ``verdict`` (:func:`verdict`),
    ``outliers`` (runs far above the rest: stalls), ``error`` (why it could not run)."""
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
            _interleave(fn, configs, base_target, runs, errors, n, warmup, min_time_s, max(n, max_rounds))
    finally:
        if router is not None and observing is not None:
            router.observing = observing
    return summarize(runs, errors)


def summarize(runs: dict[str, list[float]], errors: dict[str, str | None] | None = None) -> dict[str, Any]:
    """The rows of :func:`compare` from the timed runs of each configuration (in their order)."""
    errors = errors or dict.fromkeys(runs)
    base = next((c for c in runs if runs[c]), None)
    out: dict[str, Any] = {}
    for c, xs in runs.items():
        row: dict[str, Any] = {"runs_s": list(xs), "n": len(xs), "error": errors.get(c), "baseline": c == base,
                               "median_s": None, "q1_s": None, "q3_s": None, "kept": None, "kept_low": None,
                               "kept_high": None, "spread": None, "outliers": [], "verdict": "could not run"}
        if xs:
            med, q1, q3 = _quartiles(xs)
            row.update(median_s=med, q1_s=q1, q3_s=q3, spread=(q3 - q1) / med if med else 0.0,
                       outliers=[x for x in xs if x > q3 + 3 * (q3 - q1) and x > 1.5 * med])
            if base is not None:
                low, high = _ratio_interval(runs[base], xs) if c != base else (1.0, 1.0)
                row.update(kept=statistics.median(runs[base]) / med, kept_low=low, kept_high=high)
        out[c] = row
    for c, row in out.items():
        row["verdict"] = verdict(row, out[base] if base else None) if row["median_s"] else "could not run"
    return out


def verdict(row: dict[str, Any], base: dict[str, Any] | None) -> str:
    """``baseline``; ``not resolved`` where the interval of throughput kept holds 100 % or either
    configuration's spread (IQR / median) is larger than the difference; else ``slower``/``faster``
    with the interval (``slower: 62-71 % kept``)."""
    if base is None or row is base or row.get("baseline"):
        return "baseline"
    kept, low, high = row["kept"], row["kept_low"], row["kept_high"]
    if row["n"] < 3 or base["n"] < 3:
        return "not resolved (fewer than 3 runs)"
    effect = abs(1.0 - kept)
    if low <= 1.0 <= high:
        return "not resolved (the interval holds 100 %)"
    if max(row["spread"], base["spread"]) > effect:
        return "not resolved (the spread exceeds the difference)"
    word = "slower" if kept < 1.0 else "faster"
    return f"{word}: {low * 100:.0f}-{high * 100:.0f} % kept"


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return med, q1, q3


def _ratio_interval(base: list[float], xs: list[float]) -> tuple[float, float]:
    """A bootstrap interval (:data:`CONFIDENCE`) of median(base) / median(xs): each side resampled."""
    import random

    if len(base) < 2 or len(xs) < 2:
        r = statistics.median(base) / statistics.median(xs)
        return r, r
    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(base, k=len(base))) / statistics.median(rng.choices(xs, k=len(xs)))
                    for _ in range(BOOTSTRAP))
    cut = (1.0 - CONFIDENCE) / 2
    return ratios[int(cut * (BOOTSTRAP - 1))], ratios[int((1.0 - cut) * (BOOTSTRAP - 1))]


def _interleave(fn: Callable[[], Any], configs: list[str], base_target: str, runs: dict[str, list[float]],
                errors: dict[str, str | None], n: int, warmup: int, min_time_s: float, max_rounds: int) -> None:
    from ..session import uninstall

    timed = 0.0
    try:
        rnd = 0
        while rnd < warmup + n or (timed < min_time_s and rnd < warmup + max_rounds):
            k = rnd % len(configs)
            for name in configs[k:] + configs[:k]:  # rotated: each configuration takes each place
                if errors[name] is not None:
                    continue
                try:
                    with configuration(name, base_target):
                        # as timeit does: no garbage collection inside a timed run (a full collection of a
                        # kernel's heap takes tens of ms and lands on whichever run crosses the threshold);
                        # the collections the run's garbage asks for happen between runs
                        gc_was = gc.isenabled()
                        gc.disable()
                        try:
                            t0 = time.perf_counter()
                            fn()
                            elapsed = time.perf_counter() - t0
                        finally:
                            if gc_was:
                                gc.enable()
                except Exception as exc:  # a configuration that cannot run this cell
                    errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                    continue
                if rnd >= warmup:
                    runs[name].append(elapsed)
                    timed += elapsed
            if all(errors[c] is not None for c in configs):
                break
            rnd += 1
    finally:
        uninstall()  # the last configuration's session
