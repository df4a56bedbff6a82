"""``torch_adapter.profiler``: a profile that knows how each op was routed.

::

    import torch_adapter
    torch_adapter.install(target="mps", simulate=True)
    with torch_adapter.profiler.record("training_loop"):
        for batch in loader:
            with torch_adapter.profiler.step("train"):
                loss = model(batch).sum(); loss.backward(); opt.step()
    torch_adapter.profiler.export("trace.json")       # open in ui.perfetto.dev or chrome://tracing
    print(torch_adapter.profiler.summary())            # one row per step

``record()`` runs ``torch.profiler`` (CPU activity, plus the target's own activity on a
real CUDA/XPU/NPU/MTIA target) with shapes recorded. ``export()`` writes its Chrome trace
with the adapter's routing added (see :mod:`torch_adapter.tools.chrome_trace`): each op event's
``args`` carry ``route``, ``reason`` and ``via`` — decided against the installed target's
profile, simulated targets included — CPU-fallback copies are slices of their own, and
``step()`` blocks are ranges on a "torch_adapter: steps" track. The trace is built once,
on the first ``export()``/``summary()``, never while the program runs.

``step()`` outside ``record()`` does nothing (so it can stay in production code). One
recording runs at a time. If the profiler cannot start (another torch profiler is running)
the block runs unprofiled and a :class:`ProfilerWarning` says why: instrumentation never
breaks the user's code.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from . import chrome_trace as _chrome_trace
from ..routing.route_of import decider
from ..errors import UsageError, format_error

__all__ = ["record", "step", "export", "summary", "last", "validate", "Recording", "StepSummary",
           "ProfilerWarning"]

_LOCK = threading.Lock()
_ACTIVE: "Recording | None" = None
_LAST: "Recording | None" = None

# real target -> the ProfilerActivity that records its kernels
_ACTIVITY = {"cuda": "CUDA", "xpu": "XPU", "npu": "PrivateUse1", "mtia": "MTIA"}


class ProfilerWarning(UserWarning):
    """The profiler could not do what was asked; the program ran on, unprofiled."""


def validate(trace: Any) -> list[str]:
    """What would stop Perfetto / chrome://tracing loading ``trace`` (a dict, a list, or a path
    to a JSON file); ``[]`` when it is valid."""
    if isinstance(trace, (str, os.PathLike)):
        with open(trace) as fh:
            trace = json.load(fh)
    return _chrome_trace.validate(trace)


class Recording:
    """One ``record()`` block: its profile, built into an annotated Chrome trace on demand."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = time.time()
        self.duration_s = 0.0
        self.error: str | None = None  # why nothing was profiled, if so
        self.routing_log: Any = None  # the engine's exact counts over the block (enforcing sessions)
        self._decide: Callable[[str], Any] = lambda name: None
        self._meta: dict[str, Any] = {}
        self._prof: Any = None
        self._trace: dict[str, Any] | None = None
        self._steps: dict[str, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = f"failed: {self.error}" if self.error else f"{self.duration_s:.3f} s"
        return f"<profiler Recording {self.name!r} on {self._meta.get('target', '?')}, {state}>"

    def _next_index(self, name: str) -> int:
        with self._lock:
            index = self._steps.get(name, 0)
            self._steps[name] = index + 1
            return index

    @property
    def profiled(self) -> bool:
        return self._prof is not None and self.error is None

    def trace(self) -> dict[str, Any]:
        """The annotated Chrome trace (a dict in the JSON object format); built once."""
        if self._trace is None:
            if not self.profiled:
                raise UsageError(format_error(
                    "torch_adapter.profiler.export()", "a recording that profiled its block",
                    f"recording {self.name!r}, which did not ({self.error})",
                    fix="stop the other profiler first, then record again"))
            fd, tmp = tempfile.mkstemp(suffix=".json", prefix="torch_adapter_trace_")
            os.close(fd)
            try:
                self._prof.export_chrome_trace(tmp)
                with open(tmp) as fh:
                    raw = json.load(fh)
            finally:
                os.unlink(tmp)
            meta = {**self._meta, "name": self.name, "started": self.started, "duration_s": self.duration_s}
            if self.routing_log is not None:
                meta["routing"] = self.routing_log.to_dict()
            self._trace = _chrome_trace.annotate(raw, self._decide, meta)
            from ..core.callsite import cell_of

            _chrome_trace.name_cells(self._trace, cell_of)  # notebook cells: "cell [N], line L"
        return self._trace

    def export(self, path: str | os.PathLike[str]) -> Path:
        """Write the annotated trace to ``path`` (JSON); returns the path.

        Written by the one safe writer (:mod:`torch_adapter.core.safe_io`): the folder must exist,
        the file appears whole or not at all, devices/FIFOs/symbolic links are refused."""
        from ..core.safe_io import check_output, write_text

        out = Path(path)
        check_output(out, call=f"torch_adapter.profiler.export({os.fspath(path)!r})")  # before building the trace
        write_text(out, json.dumps(self.trace(), allow_nan=False),
                   call=f"torch_adapter.profiler.export({os.fspath(path)!r})")
        return out

    def summary(self) -> "StepSummary":
        data = self.trace()["torch_adapter"]
        return StepSummary(self.name, data.get("target", ""), bool(data.get("simulated")), list(data["steps"]),
                           self.duration_s)


def _start(rec: Recording, record_shapes: bool, with_stack: bool) -> None:
    import torch

    from ..core import torch_private as tp

    if tp.profiler_running():
        raise RuntimeError("another torch profiler is already running in this process "
                           "(torch.profiler.profile, or a torch_adapter trace using the profiler)")
    target = rec._meta["device"]
    activities = [torch.profiler.ProfilerActivity.CPU]
    kind = _ACTIVITY.get(target) if not rec._meta["simulated"] else None
    extra = getattr(torch.profiler.ProfilerActivity, kind, None) if kind else None
    if extra is not None and extra in torch.profiler.supported_activities():
        activities.append(extra)
    config = tp.profiler_config(capture_overload_names=True, profile_all_threads=True, trace_only=True)
    kwargs = {"experimental_config": config} if config is not None else {}
    prof = torch.profiler.profile(activities=activities, record_shapes=record_shapes, with_stack=with_stack, **kwargs)
    # Kineto writes "USDT: ... profiler_start/stop" lines to the process's stderr (red noise
    # under every notebook cell that profiles); it reads KINETO_LOG_LEVEL when it starts.
    # 6 is above its highest level. A value the user set wins; the environment is put back.
    quiet = "KINETO_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ["KINETO_LOG_LEVEL"] = "6"
    try:
        prof.__enter__()
    finally:
        if quiet:
            os.environ.pop("KINETO_LOG_LEVEL", None)
    rec._prof = prof
    rec._meta["activities"] = [str(a).rpartition(".")[2] for a in activities]


@contextlib.contextmanager
def record(name: str = "torch_adapter", *, record_shapes: bool = True, with_stack: bool = False) -> Iterator[Recording]:
    """Profile the block; yields the :class:`Recording` (also kept for :func:`export`/:func:`summary`).

    ``record_shapes`` (default True) is what gives fallback copies their byte counts;
    ``with_stack`` adds Python stacks to op events (slower). One recording at a time.
    """
    import torch

    global _ACTIVE, _LAST
    if not isinstance(name, str) or not name:
        raise UsageError(format_error("torch_adapter.profiler.record(name)", 'a non-empty string, e.g. "training_loop"',
                                      f"{name!r} ({type(name).__name__})", fix='record("training_loop")'))
    with _LOCK:
        if _ACTIVE is not None:
            raise UsageError(format_error(
                f"torch_adapter.profiler.record({name!r})", "no recording already running",
                f"recording {_ACTIVE.name!r} still open", why="one torch profiler runs at a time",
                fix="end the outer record() block first; mark parts of it with profiler.step(...) instead"))
        rec = Recording(name)
        _ACTIVE = rec
    engine = None
    t0 = time.perf_counter()
    try:
        try:
            rec._decide, engine, rec._meta = decider()
            _start(rec, record_shapes, with_stack)
        except Exception as exc:  # an observer that fails reports itself; the block still runs
            rec.error = f"{type(exc).__name__}: {exc}"
            rec._prof = None
            warnings.warn(f"torch_adapter.profiler.record({name!r}) could not start the profiler ({rec.error}); "
                          f"the block runs unprofiled", ProfilerWarning, stacklevel=3)
        if engine is not None and rec.profiled:
            from ..routing.log import RoutingLog

            rec.routing_log = RoutingLog(rec._meta["target"], rec._meta["simulated"])
            engine.add_log(rec.routing_log)
        t0 = time.perf_counter()
        if rec.profiled:
            with torch.profiler.record_function(f"{_chrome_trace.RECORD_PREFIX}{name}"):
                yield rec
        else:
            yield rec
    finally:
        rec.duration_s = time.perf_counter() - t0
        if engine is not None and rec.routing_log is not None:
            engine.remove_log(rec.routing_log)
        if rec._prof is not None:
            try:
                rec._prof.__exit__(None, None, None)
            except Exception as exc:  # keep the user's exception, if any; report ours
                rec.error = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"torch_adapter.profiler.record({name!r}): stopping the profiler failed "
                              f"({rec.error})", ProfilerWarning, stacklevel=3)
        with _LOCK:
            _ACTIVE = None
            _LAST = rec


@contextlib.contextmanager
def step(name: str = "step") -> Iterator[None]:
    """Mark a step (``"forward"``, ``"train"``) inside :func:`record`: a range in the trace and a
    row in :func:`summary`. Repeated names are numbered. Outside ``record()`` it does nothing."""
    rec = _ACTIVE
    if rec is None or not rec.profiled:
        yield
        return
    if not isinstance(name, str) or not name or "#" in name:
        raise UsageError(format_error("torch_adapter.profiler.step(name)", "a non-empty string without '#'",
                                      f"{name!r}", fix='step("forward")'))
    import torch

    with torch.profiler.record_function(f"{_chrome_trace.STEP_PREFIX}{name}#{rec._next_index(name)}"):
        yield


def last() -> Recording | None:
    """The most recent finished recording, or None."""
    return _LAST


def _recording(call: str, recording: Recording | None) -> Recording:
    rec = recording if recording is not None else _LAST
    if rec is None:
        raise UsageError(format_error(
            call, "a finished torch_adapter.profiler.record() block", "none recorded in this process",
            fix='wrap the code in `with torch_adapter.profiler.record("name"):` first'))
    return rec


def export(path: str | os.PathLike[str], recording: Recording | None = None) -> Path:
    """Write the last recording (or ``recording``) as a Chrome trace JSON at ``path``."""
    return _recording(f"torch_adapter.profiler.export({os.fspath(path)!r})", recording).export(path)


def summary(recording: Recording | None = None) -> "StepSummary":
    """Per-step figures of the last recording (or ``recording``): a :class:`StepSummary`."""
    return _recording("torch_adapter.profiler.summary()", recording).summary()


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


class StepSummary:
    """One row per ``step()`` (or one for the whole recording when no step was marked).

    ``rows`` are dicts: ``name``, ``index``, ``wall_ms``, ``ops`` (outermost op calls),
    ``calls``/``time_ms`` per route, ``fallback_calls`` (at any depth), ``fallback_ms``,
    ``copies``, ``bytes_copied``, ``copy_ms``. ``str()`` and ``__rich__`` render a table.
    """

    def __init__(self, name: str, target: str, simulated: bool, rows: list[dict[str, Any]], duration_s: float) -> None:
        self.name, self.target, self.simulated = name, target, simulated
        self.rows = rows
        self.duration_s = duration_s

    def to_dict(self) -> dict[str, Any]:
        return {"recording": self.name, "target": self.target, "simulated": self.simulated,
                "duration_s": self.duration_s, "steps": self.rows}

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"<StepSummary {self.name!r}: {len(self.rows)} steps on {self.target}>"

    def __rich__(self) -> Any:
        from rich.table import Table

        label = f"{self.target} (simulated)" if self.simulated else self.target
        table = Table(title=f"torch_adapter profile {self.name!r} on {label}: {self.duration_s * 1e3:.1f} ms")
        for col in ("step", "wall ms", "ops", "native", "composite", "fallback", "fallback ms", "copies", "copied"):
            table.add_column(col, justify="left" if col == "step" else "right")
        for r in self.rows:
            fb = r["calls"].get("fallback", 0)
            table.add_row(f"{r['name']} #{r['index']}", f"{r['wall_ms']:.2f}", str(r["ops"]),
                          str(r["calls"].get("native", 0)), str(r["calls"].get("composite", 0)),
                          f"[red]{fb}[/red]" if fb else "0", f"{r['fallback_ms']:.2f}", str(r["copies"]),
                          _fmt_bytes(r["bytes_copied"]))
        if not self.rows:
            table.caption = "no step() was marked inside the recording"
        return table

    def render(self, width: int = 120) -> str:
        from rich.console import Console

        console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None, force_jupyter=False)
        console.print(self)
        console.file.close()
        return console.export_text()

    def __str__(self) -> str:
        return self.render()
