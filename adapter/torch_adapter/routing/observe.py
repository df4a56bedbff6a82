"""Observation on real targets: which ops ran, how often, for how long, and under which op.

::

    obs = OpObserver()
    obs.start()
    model(x).sum().backward()
    result = obs.stop()
    result.calls["aten::addmm"]          # calls, keyed "aten::name.overload" ("aten::mm"
    result.self_time_ns["aten::addmm"]   # for the default overload, as the dispatcher names it)
    result.children["aten::linear"]      # {"aten::t": 1, "aten::addmm": 1}

Two backends do the same job:

- ``"cpp"`` — a global RecordFunction callback in a small C++ extension (``_observer.cpp``
  next to this file) built at install (shipped in ``torch_adapter/_built``) or by ``torch-adapter
  build`` (7 s on an idle 2-core machine, up to ~25 s on a busy one; named by the source and
  the torch version); never compiled in a program's way: an "auto" observer that finds no build
  counts with the profiler while a background build prepares the next session
  (:mod:`torch_adapter.core.cpp_build`). It sees every dispatcher call on
  every thread, above autograd, so CompositeImplicitAutograd ops (``aten::linear``,
  ``aten::einsum``, ``aten::scaled_dot_product_attention``) appear with their pieces under
  them although a TorchDispatchMode never sees them. Counting is exact, not sampled: per
  dispatcher call RecordFunction's own machinery costs ~130 ns on this project's 2-core Xeon
  and our callback ~70 ns more (one TLS lookup, lock-free owner-thread counters, the TSC as
  clock where it is invariant — ``TORCH_ADAPTER_OBSERVER_CLOCK=steady`` forces steady_clock;
  ``benchmarks/bench_decode.py`` prints both); a tiny-SD training step keeps ~98.5 % of its
  throughput (``benchmarks/bench_observe.py``).
- ``"python"`` — the fallback when no C++ compiler is available: the autograd profiler's
  event tree (with overload names), walked when the observer stops. Same counts; recording
  is cheap, but building and walking the tree at stop costs ~28 ms per tiny-SD step
  (~70 % of throughput kept).

``calls`` counts every call at every depth: ``aten::addmm`` called by ``aten::linear``
counts in both ``calls`` and ``children["aten::linear"]``; ``top_level`` holds the calls
made outside any observed op. Besides dispatcher ops, a few ranges that C++ code names by a
string appear under their own names (``"autograd::engine::evaluate_function: MmBackward0"``,
whose children are the ops a backward node ran); :func:`is_op_key` tells them apart.

Observers nest and may overlap (each gets only what ran between its own start and stop);
the C++ callback is registered while at least one observer runs and removed after the last
stops. An observer never breaks user code: a failure to build, register or read becomes a
warning and an entry in ``result.errors``, and the result holds what was counted.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from ..core.cpp_build import Part
from ..errors import UsageError, format_error
from .observed import ObserveResult, is_op_key

__all__ = [
    "OpObserver",
    "ObserveResult",
    "is_compiled_available",
    "is_built",
    "build",
    "is_op_key",
    "main",
]

_SOURCE = Path(__file__).with_name("_observer.cpp")
_BACKENDS = ("auto", "cpp", "python")
_LOCK = threading.RLock()
_EXT: Any = None  # the loaded extension module
_BUILD_ERROR: str | None = None  # why the extension could not be built, once tried
_WARNED: set[str] = set()  # messages warned about once per process
_STATE: dict[str, str] = {}  # "background": what the background build said


# -- the C++ extension: naming, building, loading ---------------------------------------
PART = Part("observer", "torch_adapter_observer", _SOURCE, "the C++ op observer (per-cell routing reports)",
            fallback="the same counts, ~28 ms more per tiny-SD training step (~70 % of its throughput kept)")


def _extension_name() -> str:
    return PART.name


def _build_dir() -> Path:
    from ..core.torch_private import extension_build_dir

    return extension_build_dir(_extension_name())


def is_built() -> bool:
    """Is the extension for this source and torch version already compiled (cached)?"""
    from ..core.torch_private import is_extension_built

    return is_extension_built(_extension_name())


def is_compiled_available() -> bool:
    """Can the C++ backend be used here: loaded, cached, or buildable (a C++ compiler and
    ninja present)? Never compiles."""
    if _EXT is not None:
        return True
    if _BUILD_ERROR is not None:
        return False
    from ..core.torch_private import can_build_extensions

    return is_built() or can_build_extensions()


def build(*, verbose: bool = False) -> Path:
    """Compile (or load the cached) extension now; returns the folder holding it.

    For CI and images: pay the compile once (``python -m torch_adapter.routing.observe
    --build``). Raises :class:`~torch_adapter.errors.AdapterError` when it cannot be built.
    """
    _load(verbose=verbose, strict=True)
    return _build_dir()


def _load(*, verbose: bool = False, strict: bool = False) -> Any:
    """The extension module, or None (the profiler backend serves; the reason is kept).

    A finished build (shipped with the package or cached) is imported. Otherwise ``strict`` (``build()``,
    ``OpObserver(backend="cpp")``) compiles it now; an ``"auto"`` observer never does: it starts the
    build in the background for the next session and this one counts with the profiler
    (:mod:`torch_adapter.core.cpp_build`'s policy)."""
    global _EXT, _BUILD_ERROR
    with _LOCK:
        if _EXT is not None:
            return _EXT
        if _BUILD_ERROR is not None and not strict:
            return None
        from ..core.torch_private import can_build_extensions, import_built_extension, load_extension

        built = import_built_extension(_extension_name())
        if built is not None:
            _EXT = built
            return _EXT
        if not strict:
            from ..core.cpp_build import build_in_background

            _STATE["background"] = state = build_in_background(PART)
            if state in ("started", "building"):
                return None  # not an error: the next start looks again
            _BUILD_ERROR = _build_failure(RuntimeError(state))
            return None
        try:
            if not can_build_extensions():
                raise RuntimeError("no C++ compiler ($CXX, else c++) or no ninja on this machine")
            if not verbose:
                print("torch_adapter: compiling the C++ op observer (once; ~10 s, then cached; `torch-adapter build` does it ahead)...",
                      file=sys.stderr, flush=True)
            _EXT = load_extension(_extension_name(), _SOURCE, verbose=verbose)
            _BUILD_ERROR = None
        except Exception as exc:  # a compiler error, no compiler, no ninja: fall back
            _BUILD_ERROR = _build_failure(exc)
            from ..errors import AdapterError

            raise AdapterError(_BUILD_ERROR) from exc
        return _EXT


def unavailable_why() -> str:
    """Why the C++ observer does not serve this session, and what the stand-in costs."""
    if _BUILD_ERROR is not None:
        return _BUILD_ERROR
    state = _STATE.get("background", "")
    doing = ("being built in the background for the next session" if state in ("started", "building")
             else f"not built ({state})" if state else "not built")
    return (f"torch_adapter: the C++ op observer is {doing}; until it is, ops are counted through the "
            f"autograd profiler — {PART.fallback}. `torch-adapter build` builds every C++ part now "
            "(about a minute, once per torch version).")


def _build_failure(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    detail = " | ".join(text[-6:]) if text else type(exc).__name__
    return format_error(
        "torch_adapter.routing.observe (building the C++ observer)",
        "a C++ compiler and ninja that build a torch extension",
        f"{type(exc).__name__}: {detail}",
        why="the cheap observer is a small C++ extension compiled at first use",
        fix="install g++ (or set CXX) and `pip install ninja`, then run "
            "`python -m torch_adapter.routing.observe --build`; meanwhile the profiler-based "
            "backend is used (slower)")


# -- the observer -------------------------------------------------------------------------
class OpObserver:
    """Counts the ops that run between :meth:`start` and :meth:`stop`, on every thread.

    ``backend``: ``"auto"`` (C++ when it builds, else the profiler), ``"cpp"`` or
    ``"python"``. After :meth:`start`, :attr:`backend` says which one is in use.
    Also a context manager: ``with OpObserver() as obs: ...`` then ``obs.result``.
    """

    def __init__(self, backend: str = "auto") -> None:
        if backend not in _BACKENDS:
            raise UsageError(format_error("OpObserver(backend=...)", f"one of {_BACKENDS}", repr(backend),
                                          fix='OpObserver(backend="auto")'))
        self.requested = backend
        self.backend: str | None = None
        self.result: ObserveResult | None = None
        self._impl: Any = None
        self._t0 = 0
        self._errors: list[str] = []

    @property
    def running(self) -> bool:
        return self._impl is not None

    def start(self) -> "OpObserver":
        """Begin counting. Never raises for an observer failure (see ``result.errors``)."""
        if self._impl is not None:
            raise UsageError(format_error("OpObserver.start()", "an observer that is not running",
                                          "one already started", fix="call stop() before starting again"))
        self._errors = []
        self.result = None
        impl: Any = None
        if self.requested in ("auto", "cpp"):
            try:
                ext = _load(strict=self.requested == "cpp")
            except Exception:  # asked for C++ and it does not build: the reason is reported
                ext = None
            if ext is None and _BUILD_ERROR is None and self.requested == "auto":
                from ..core.cpp_build import say_once  # being built: a notice, not a failure

                say_once("observer", unavailable_why())
            elif ext is None:
                self._report(unavailable_why(), once=True)
            else:
                impl = _CppSession(ext)
        if impl is None and self.requested in ("auto", "python"):
            from ._observe_profiler import ProfilerSession

            impl = ProfilerSession()
        if impl is None:
            impl = _NullSession()
        try:
            impl.start()
        except Exception as exc:  # e.g. a user's profiler already running
            self._report(f"OpObserver.start() with backend {impl.name!r} failed: {type(exc).__name__}: {exc}")
            impl = _NullSession()
        self.backend = impl.name
        self._impl = impl
        self._t0 = time.perf_counter_ns()
        return self

    def stop(self) -> ObserveResult:
        """Stop counting and return what ran since :meth:`start`."""
        impl = self._impl
        if impl is None:
            raise UsageError(format_error("OpObserver.stop()", "a running observer", "one not started",
                                          fix="call start() first, or use `with OpObserver() as obs:`"))
        self._impl = None
        wall = time.perf_counter_ns() - self._t0
        try:
            result = impl.stop()
        except Exception as exc:
            self._report(f"OpObserver.stop() with backend {impl.name!r} failed: {type(exc).__name__}: {exc}")
            result = ObserveResult()
        result.backend = impl.name
        result.wall_ns = wall
        result.errors = [*self._errors, *result.errors]
        self.result = result
        return result

    def __enter__(self) -> "OpObserver":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        if self._impl is not None:
            self.stop()

    def _report(self, message: str, *, once: bool = False) -> None:
        """Keep ``message`` for the result and warn (``once``: only the first time per process)."""
        self._errors.append(message)
        if once:
            if message in _WARNED:
                return
            _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class _NullSession:
    """What an observer does when no backend could start: nothing, visibly."""

    name = "none"

    def start(self) -> None:
        pass

    def stop(self) -> ObserveResult:
        return ObserveResult()


class _CppSession:
    """One observer's use of the shared C++ callback: acquire, snapshot, diff, release."""

    name = "cpp"

    def __init__(self, ext: Any) -> None:
        self.ext = ext
        self.before: tuple[Any, ...] | None = None

    def start(self) -> None:
        self.ext.acquire()
        try:
            self.before = self.ext.snapshot()
        except BaseException:
            self.ext.release()
            raise

    def stop(self) -> ObserveResult:
        try:
            after = self.ext.snapshot()
        finally:
            self.ext.release()
        assert self.before is not None
        calls0, self0, children0, top0, _events0, errors0 = self.before
        calls1, self1, children1, top1, _events1, errors1 = after
        result = ObserveResult(
            calls=_diff(calls1, calls0),
            self_time_ns=_diff(self1, self0),
            children={p: d for p, kids in children1.items() if (d := _diff(kids, children0.get(p, {})))},
            top_level=_diff(top1, top0),
        )
        if errors1 > errors0:
            result.errors.append(f"the C++ observer caught {errors1 - errors0} internal errors; counts may be low")
        return result


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: d for k, v in after.items() if (d := v - before.get(k, 0)) > 0}


def _registered() -> bool:
    """Is the C++ callback registered now? (False when the extension was never loaded.)"""
    return bool(_EXT is not None and _EXT.registered())


# -- CLI: python -m torch_adapter.routing.observe --build ------------------------------
def main(argv: list[str] | None = None) -> int:
    """``--build`` compiles the C++ observer (once; cached); ``--status`` says what is there."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m torch_adapter.routing.observe",
                                     description="Build or inspect torch_adapter's C++ op observer.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--build", action="store_true", help="compile the observer now (cached)")
    group.add_argument("--status", action="store_true", help="print whether it is built or buildable")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    args = parser.parse_args(argv)
    if args.status:
        print(f"built: {is_built()}  buildable: {is_compiled_available()}  folder: {_build_dir()}")
        return 0
    t0 = time.perf_counter()
    from ..errors import AdapterError

    try:
        where = build(verbose=args.verbose)
    except AdapterError as exc:
        print(exc)
        return 1
    print(f"C++ observer ready in {time.perf_counter() - t0:.1f} s: {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
