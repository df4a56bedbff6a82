"""Measuring coverage: one training step per model family × target, under ``trace()``.

For each family: build it (:func:`.factories.build`), run one plain warm-up step (so the
optimizer state exists and the measured step is a steady-state one; a failure here is
the factory's, reported as a UsageError), then for each target install it
(simulated, except ``host``/``auto``), and record forward + backward + optimizer step
with ``torch_adapter.trace(use_observer=False)`` — the same dispatch-level vantage point on
every target, so rows compare. The optimizer is AdamW, with ``foreach`` as torch would
choose it on the target's device (the multi-tensor ``_foreach_*`` kernels on cuda, xpu,
mtia and PrivateUse1 backends; one tensor at a time elsewhere).

If a session is already installed for a measured target, it is used as it is (its
registrations and fallback policy apply); other targets are installed for their rows
with ``adapted()`` and the previous session's settings are put back afterwards — which
is refused (UsageError) when that session holds ``register_*`` registrations, since those
would not come back.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..errors import UsageError, format_error
from .data import ROUTES, CoverageReport, CoverageRow, FallbackOp, host_selected
from .factories import Workload, build, resolve_models
from .models import Family

__all__ = ["DEFAULT_TARGETS", "TargetSpec", "measure", "parse_targets", "analyse", "training_step"]

DEFAULT_TARGETS = ("cuda", "mps", "npu", "xpu", "mtia")
_REAL = ("host", "auto")
_FOREACH_KEYS = ("CUDA", "XPU", "MTIA", "PrivateUse1")  # torch's _get_foreach_kernels_supported_devices()
_WORST = {"native": 0, "composite": 1, "fallback": 2}


class TargetSpec:
    """A ``--targets`` entry: what to install, what to show, what explain() takes."""

    def __init__(self, spec: str) -> None:
        import torch_adapter

        self.spec = spec
        self.simulate = spec.strip().lower() not in _REAL
        info = torch_adapter.describe(spec, simulate=self.simulate)  # TargetError/ProfileError if bad
        self.name = info["name"]
        self.dispatch_key = str(info.get("dispatch_key", ""))
        self.label = f"{spec.strip().lower()} ({self.name})" if not self.simulate else self.name
        self.explain_target = spec if spec.endswith(".toml") else self.name
        details = info.get("details", {})
        self.profile = str(details.get("profile", "")) if self.simulate else f"live dispatcher ({self.dispatch_key})"

    def __repr__(self) -> str:
        return f"TargetSpec({self.spec!r})"


def parse_targets(targets: Any = None) -> list[TargetSpec]:
    """``targets``: None (cuda, mps, npu, xpu, mtia), a comma-separated string, or a list of names / .toml paths."""
    if targets is None:
        targets = DEFAULT_TARGETS
    items = [t.strip() for t in targets.split(",") if t.strip()] if isinstance(targets, str) else list(targets)
    if not items or not all(isinstance(t, str) for t in items):
        raise UsageError(format_error(
            "torch_adapter.coverage.measure(targets=...)", "target names or .toml profiles, e.g. 'cuda,mps,host'",
            repr(targets), why="each row is one model on one target", fix="pass e.g. targets=['cuda', 'mps']"))
    specs = [TargetSpec(t) for t in items]
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise UsageError(format_error("torch_adapter.coverage.measure(targets=...)", "each target once",
                                      f"{dup[0]!r} twice ({', '.join(items)})", fix="remove the duplicate"))
    return specs


def training_step(work: Workload, optimizer: Any) -> Any:
    """Forward, loss, backward, optimizer step (gradients cleared first). Returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = work.loss_fn(work.forward())
    loss.backward()
    optimizer.step()
    return loss


def analyse(log: Any, *, top: int = 5) -> dict[str, Any]:
    """Counts of a RoutingLog: top-level calls and distinct ops per route, calls nested in
    composite ops per route, and the ``top`` fallback ops by calls — called by the program
    (``top_fallbacks``) and as pieces of composite ops (``nested_fallbacks``)."""
    calls = dict.fromkeys(ROUTES, 0)
    nested = dict.fromkeys(ROUTES, 0)
    op_route: dict[str, str] = {}
    fallbacks: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]] = ({}, {})
    for rec in log.records():
        if rec.calls <= 0:  # an entry that only carries bytes for calls counted elsewhere
            continue
        if rec.parent is None:
            calls[rec.route] += rec.calls
            prev = op_route.get(rec.op)
            if prev is None or _WORST[rec.route] > _WORST[prev]:
                op_route[rec.op] = rec.route
        else:
            nested[rec.route] += rec.calls
        if rec.route == "fallback":
            group = fallbacks[rec.parent is not None]
            entry = group.setdefault(rec.op, {"calls": 0, "reason": rec.reason, "inside": []})
            entry["calls"] += rec.calls
            if rec.parent is not None and rec.parent not in entry["inside"]:
                entry["inside"].append(rec.parent)
    ops = dict.fromkeys(ROUTES, 0)
    for route in op_route.values():
        ops[route] += 1

    def ranked(group: dict[str, dict[str, Any]]) -> tuple[FallbackOp, ...]:
        best = sorted(group.items(), key=lambda kv: (-kv[1]["calls"], kv[0]))[:top]
        return tuple(FallbackOp(op, e["calls"], e["reason"], tuple(e["inside"]), host_selected(op)) for op, e in best)

    dtypes = {}
    if getattr(log, "dtype_note", None) is not None or getattr(log, "dtype_findings", None):
        dtypes = {"judged": not log.dtype_note, "note": log.dtype_note or "", "findings": log.dtype_table()[:top]}
    return {"calls": calls, "ops": ops, "nested_calls": nested, "top_fallbacks": ranked(fallbacks[0]),
            "nested_fallbacks": ranked(fallbacks[1]), "dtypes": dtypes}


def _foreach(spec: TargetSpec) -> bool:
    return spec.dispatch_key in _FOREACH_KEYS


def _is_session_target(session: Any, spec: TargetSpec) -> bool:
    return session.target.name == spec.name and bool(session.target.simulated) == spec.simulate


def _check_session(specs: list[TargetSpec]) -> None:
    """Refuse to replace an installed session that holds registrations (adapted() would put its
    settings back, not its registrations)."""
    import torch_adapter
    from ..routing.registry import registry_of

    session = torch_adapter.current()
    registry = registry_of(session, create=False) if session is not None else None
    if registry is None or not len(registry):
        return
    others = [s.spec for s in specs if not _is_session_target(session, s)]
    if others:
        raise UsageError(format_error(
            "torch_adapter.coverage.measure(targets=...)",
            f"only the installed target ({session.target.name}) while its session holds registrations",
            f"targets {', '.join(others)} as well",
            why="measuring another target replaces the installed session for a while, and its "
                f"{len(registry)} register_* registration(s) would not come back",
            fix=f"measure targets=[{session.target.name!r}] now and the others after uninstall(), or in a "
                "fresh process (torch-adapter coverage)"))


def _session_for(spec: TargetSpec) -> Any:
    """A context manager installing ``spec`` — or the installed session, when it is that target."""
    import contextlib

    import torch_adapter

    session = torch_adapter.current()
    if session is not None and _is_session_target(session, spec):
        return contextlib.nullcontext(session)
    # record: one step lists every call the real target refuses for its dtype, and goes on
    return torch_adapter.adapted(spec.spec, simulate=spec.simulate,
                                 **({"dtype_check": "record"} if spec.simulate else {}))


def _measure_one(fam: Family, work: Workload, optimizer: Any, spec: TargetSpec, top: int) -> CoverageRow:
    import torch_adapter

    base = dict(model=fam.name, kind=fam.kind, description=fam.description, target=spec.label,
                target_spec=spec.explain_target, simulated=spec.simulate, profile=spec.profile)
    for group in optimizer.param_groups:
        group["foreach"] = _foreach(spec)
    with _session_for(spec):
        with torch_adapter.trace(use_observer=False) as log:
            try:
                training_step(work, optimizer)
            except Exception as exc:  # the step fails on this target: that is the row's finding
                error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            else:
                error = None
    return CoverageRow(**base, **analyse(log, top=top), error=error)


def _prepare(fam: Family) -> tuple[Workload, Any]:
    import torch

    work = build(fam)
    optimizer = torch.optim.AdamW(work.model.parameters(), lr=1e-4, foreach=False)
    try:
        training_step(work, optimizer)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(format_error(
            f"coverage: one training step of {fam.name} ({fam.source})", "a step that runs without the adapter",
            f"{type(exc).__name__}: {exc}", why="coverage measures a step that works on this machine first",
            fix="check the factory's model, example inputs and loss_fn: loss_fn(model(inputs)).backward() "
                "must work")) from exc
    return work, optimizer


def measure(models: Any = None, targets: Any = None, *, top: int = 5,
            progress: Callable[[str, str], None] | None = None) -> CoverageReport:
    """Measure op coverage of one training step for each model family × target.

    ``models``: None (every built-in family: resnet, bert, gpt2, sd_unet, sd_vae, clip_text,
    lstm, custom_op), a comma-separated string, or a list of built-in names,
    ``"module:factory"`` strings (``"path/to/file.py:factory"`` too) and factory functions.
    ``targets``: None (cuda, mps, npu, xpu, mtia — simulated), or names: built-in simulated profiles
    (cuda, mps, npu, xpu, mtia, cpu), ``host``/``auto`` (this machine's real target) and ``.toml``
    profiles. ``top``: how many fallback ops each row lists. ``progress(model, target)`` is
    called before each measurement.

    Returns a :class:`~torch_adapter.coverage.data.CoverageReport`; a step that fails on a
    target gives a row with ``error`` set. Coverage is where ops would run, not speed.
    """
    import torch

    specs = parse_targets(targets)
    _check_session(specs)
    families = resolve_models(models)
    if not isinstance(top, int) or top < 0:
        raise UsageError(format_error("torch_adapter.coverage.measure(top=...)", "an int >= 0",
                                      f"{top!r} ({type(top).__name__})", fix="e.g. top=5"))
    started = time.time()
    t0 = time.perf_counter()
    rows: list[CoverageRow] = []
    timings: dict[str, float] = {}
    for fam in families:
        t_model = time.perf_counter()
        work, optimizer = _prepare(fam)
        for spec in specs:
            if progress is not None:
                progress(fam.name, spec.label)
            rows.append(_measure_one(fam, work, optimizer, spec, top))
        timings[fam.name] = round(time.perf_counter() - t_model, 3)
        del work, optimizer
    meta = {"started": started, "duration_s": round(time.perf_counter() - t0, 3), "seconds_per_model": timings,
            "optimizer": "AdamW (foreach as torch picks it for the target's device)",
            "sources": {f.name: f.source for f in families}}
    return CoverageReport(rows=tuple(rows), targets=tuple(s.label for s in specs),
                          models=tuple(f.name for f in families), torch_version=str(torch.__version__), meta=meta)

