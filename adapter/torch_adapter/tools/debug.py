"""``torch_adapter.debug``: find the first op that produced a NaN/Inf, or that disagrees with
the CPU — named by op, route, module path and the user's line.

::

    torch_adapter.debug.enable_nan_check()             # mode="raise" (default) or "warn"
    loss = unet(x, t, text).sample.mean(); loss.backward()
    # NumericsError: aten::log (forward in unet.down_blocks.0.attentions.0) at train.py:41:
    #   expected finite values from finite inputs, got 3 NaN among 64 elements of output 0 ...
    torch_adapter.debug.disable_nan_check()

    torch_adapter.debug.enable_cpu_compare(atol=1e-4, rtol=1e-3, ops=["aten::heaviside"])

**NaN/Inf check.** After each op, its floating outputs are checked. An op is reported when
it *produced* the value: a NaN from inputs without NaN, or an Inf from inputs without Inf
and without an infinite scalar argument (``masked_fill(mask, -inf)`` and ``full(-inf)`` are
deliberate). Ops that only move or view values (copies, views) and ``empty*`` (whose
memory is uninitialised) are not checked. ``mode="raise"`` raises
:class:`~torch_adapter.errors.NumericsError` at the first one; ``"warn"`` issues a
:class:`NumericsWarning` per new (op, module) since it was enabled and keeps going; :func:`findings` lists them.

**CPU compare.** Each selected op is re-run on fresh CPU copies of its inputs (made before
the op runs, so in-place ops compare too) and the results are compared with ``atol`` /
``rtol`` (by default torch.testing's per-dtype tolerances). On a real target that checks
the device's kernels against the CPU's. On the CPU — a simulated target or policies — the
re-run uses the plain aten kernel (the routing engine is bypassed), so it checks that the
target's composite routes and your ``register_fallback`` implementations (route ``yours``)
compute what the plain kernel does. Random ops and ``empty*`` are skipped.
``routes=("composite", "yours")`` narrows it to the ops routed that way on the target.

Both are opt-in: they run every op through Python (a TorchDispatchMode, see
:mod:`torch_adapter.tools.tool_mode`) on the thread that enabled them — backward included — and
stay on across notebook cells until disabled, or until ``uninstall()`` of the session that
was installed when they were enabled. ``install(debug_mode=...)`` turns them on too.
"""

from __future__ import annotations

import fnmatch
import math
import weakref
from typing import Any, Iterable

from . import tool_mode as _tool_mode
from .numerics import (LABEL, Finding, NumericsWarning, arg_values, checkable, count, findings, forget_warned, plan, report, tensors)
from ..errors import NumericsError, UsageError, format_error
from ..routing.wording import ROUTES

__all__ = ["enable_nan_check", "disable_nan_check", "enable_cpu_compare", "disable_cpu_compare",
           "findings", "Finding", "NumericsWarning", "NumericsError"]

_MODES = ("raise", "warn")
_ROUTES = ROUTES
# torch.testing.assert_close's default (rtol, atol) per dtype
_TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
               "float64": (1e-7, 1e-7), "complex32": (1e-3, 1e-5), "complex64": (1.3e-6, 1e-5),
               "complex128": (1e-7, 1e-7)}
_CLOSING: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _check_mode(call: str, mode: Any) -> None:
    if mode not in _MODES:
        raise UsageError(format_error(call, "mode='raise' or mode='warn'", f"{mode!r}",
                                      fix=f"e.g. {call.partition('(')[0]}(mode='warn')"))


def _close_with_session(session: Any = None) -> None:
    """Have ``session`` (default: the installed one) turn the checks off at its uninstall()."""
    if session is None:
        from ..core.state import current

        session = current()
    if session is not None and session not in _CLOSING:
        _CLOSING.add(session)
        session.closers.append(_session_closed)


def _session_closed() -> None:
    disable_nan_check()
    disable_cpu_compare()


# -- NaN / Inf ------------------------------------------------------------------------------
class _NanCheck:
    def __init__(self, mode: str, inf: bool) -> None:
        self.mode, self.inf = mode, inf

    def before(self, func: Any, args: tuple, kwargs: dict) -> Any:
        skip, written, _ = plan(func)
        if skip or not written:
            return None
        values = arg_values(func, args, kwargs)  # written arguments, as they were before the op
        return [self._bad(t) for i in written if i < len(values) for _, t in tensors(values[i])]

    def _bad(self, t: Any) -> tuple[bool, bool]:
        import torch

        if not checkable(t) or bool(torch.isfinite(t).all()):
            return (False, False)
        return (bool(torch.isnan(t).any()), bool(torch.isinf(t).any()))

    def after(self, func: Any, args: tuple, kwargs: dict, out: Any, before: Any) -> None:
        import torch

        if plan(func)[0]:
            return
        bad = [(i, t) for i, t in tensors(out) if checkable(t) and not bool(torch.isfinite(t).all())]
        if not bad:
            return
        written = plan(func)[1]
        values = arg_values(func, args, kwargs)
        inputs = [t for k, v in enumerate(values) if k not in written for _, t in tensors(v) if checkable(t)]
        had = [self._bad(t) for t in inputs] + list(before or [])  # written ones: as they were before
        had_nan, had_inf = any(n for n, _ in had), any(i for _, i in had)
        scalar_inf = any(isinstance(v, (float, complex)) and not math.isfinite(abs(v)) for v in values)
        for i, t in bad:
            nan, inf = count(t, "nan"), count(t, "inf")
            kind = "nan" if nan and not had_nan else ("inf" if inf and self.inf and not had_inf and not scalar_inf
                                                      else None)
            if kind is not None:
                n = nan if kind == "nan" else inf
                held = len(inputs) + len(before or [])
                detail = (f"{n} {LABEL[kind]} among {t.numel()} elements of output {i} ({t.dtype}, shape "
                          f"{list(t.shape)}); its {held} tensor input(s) held no {LABEL[kind]}")
                report("nan_check", kind, func, detail, self.mode)
                return


def enable_nan_check(mode: str = "raise", *, inf: bool = True) -> None:
    """Report the first op that produces a NaN (and, with ``inf=True``, an Inf): raise
    :class:`NumericsError` (``mode="raise"``) or warn (``"warn"``). Stays on until
    :func:`disable_nan_check` or the session's ``uninstall()``."""
    _check_mode("torch_adapter.debug.enable_nan_check(mode=...)", mode)
    forget_warned("nan_check")
    _tool_mode.enable("nan_check", _NanCheck(mode, bool(inf)))
    _close_with_session()


def disable_nan_check() -> None:
    """Stop checking for NaN/Inf (safe to call when off)."""
    _tool_mode.disable("nan_check")


# -- CPU compare ----------------------------------------------------------------------------
def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    for p in patterns:
        if fnmatch.fnmatchcase(name, p):
            return True
        if not any(c in p for c in "*?[") and "." not in p.partition("::")[2] and name.startswith(p + "."):
            return True
    return False


class _CpuCompare:
    def __init__(self, atol: float | None, rtol: float | None, ops: tuple[str, ...] | None,
                 routes: frozenset[str] | None, mode: str) -> None:
        self.atol, self.rtol, self.ops, self.routes, self.mode = atol, rtol, ops, routes, mode
        self._selected: dict[Any, bool] = {}
        self._session: Any = ...  # the session the cached choices were made for
        self._engine: Any = None

    def _wanted(self, func: Any) -> bool:
        from ..core.state import current

        session = current()
        if session is not self._session:  # installed, uninstalled or replaced: decide again
            from ..routing.route_of import decider

            self._session, self._selected = session, {}
            self._decide, self._engine, _ = decider()
        wanted = self._selected.get(func)
        if wanted is None:
            skip, _, random = plan(func)
            name = func.name()
            wanted = not (skip or random) and (self.ops is None or _matches(name, self.ops))
            if wanted and self.routes is not None:
                d = self._decide(name)
                wanted = d is not None and d.route.value in self.routes
            self._selected[func] = wanted
        return wanted

    def before(self, func: Any, args: tuple, kwargs: dict) -> Any:
        import torch

        if not self._wanted(func):
            return None

        def to_cpu(o: Any) -> Any:
            if isinstance(o, torch.Tensor):
                return o.to("cpu", copy=True)
            if isinstance(o, torch.device):
                return torch.device("cpu")
            if isinstance(o, (list, tuple)):
                return type(o)(to_cpu(x) for x in o)
            return o

        return to_cpu(tuple(args)), {k: to_cpu(v) for k, v in kwargs.items()}

    def after(self, func: Any, args: tuple, kwargs: dict, out: Any, copies: Any) -> None:
        if copies is None:
            return
        cargs, ckwargs = copies
        state = None
        if self._engine is not None:
            from ..routing.dispatch_state import state
            state.bypass += 1  # the plain host kernel, not the target's route
        try:
            ref = func(*cargs, **ckwargs)
        except (RuntimeError, NotImplementedError):  # the CPU cannot run it: nothing to compare
            return
        finally:
            if state is not None:
                state.bypass -= 1
        got, want = list(tensors(out)), list(tensors(ref))
        if len(got) != len(want):
            return
        for (i, a), (_, r) in zip(got, want):
            detail = self._differs(a, r)
            if detail:
                report("cpu_compare", "mismatch", func, f"output {i} ({a.dtype}, shape {list(a.shape)}): {detail}",
                        self.mode)
                return

    def _differs(self, a: Any, r: Any) -> str | None:
        import torch

        if type(a) not in (torch.Tensor, torch.nn.Parameter) or a.device.type == "meta":
            return None
        a = a.detach().to("cpu")
        if a.shape != r.shape or a.dtype != r.dtype:
            return f"the CPU gives {r.dtype} shape {list(r.shape)} instead"
        if not (a.is_floating_point() or a.is_complex()):
            ne = (a != r)
            return None if not bool(ne.any()) else f"{int(ne.sum())} of {a.numel()} elements differ (exact dtype)"
        rtol, atol = _TOLERANCES.get(str(a.dtype).rpartition(".")[2], (1.3e-6, 1e-5))
        rtol = self.rtol if self.rtol is not None else rtol
        atol = self.atol if self.atol is not None else atol
        close = torch.isclose(a, r, rtol=rtol, atol=atol, equal_nan=True)
        if bool(close.all()):
            return None
        bad = (~close).nonzero()[0].tolist()
        diff = (a.double() - r.double()).abs() if not a.is_complex() else (a - r).abs().double()
        diff = torch.where(close, torch.zeros_like(diff), diff.nan_to_num(nan=math.inf))
        return (f"{int((~close).sum())} of {a.numel()} elements differ; the largest |difference| is "
                f"{float(diff.max()):.3g}; first at index {tuple(bad)}: {a[tuple(bad)].item()!r} on the target vs "
                f"{r[tuple(bad)].item()!r} on the CPU (atol={atol:g}, rtol={rtol:g})")


def _check_ops(ops: Any) -> tuple[str, ...] | None:
    call = "torch_adapter.debug.enable_cpu_compare(ops=...)"
    if ops is None:
        return None
    if isinstance(ops, str):
        ops = [ops]
    if not isinstance(ops, (list, tuple, set, frozenset)) or not all(isinstance(o, str) for o in ops):
        raise UsageError(format_error(call, 'op names or globs, e.g. ["aten::log", "aten::_linalg_*"]',
                                      f"{ops!r} ({type(ops).__name__})", fix='ops=["aten::heaviside"]'))
    from ..routing.names import candidates, known_op_names, op_name

    known = known_op_names()
    out = []
    for raw in ops:
        (name,) = candidates(raw)
        if not any(_matches(n, (name,)) for n in known):
            if not any(c in raw for c in "*?["):
                op_name(raw, call=call)  # raises, with close matches
            raise UsageError(format_error(call, "patterns that match ops of this torch", repr(raw),
                                          fix='write "aten::name" (all overloads), "aten::name.overload" or a glob'))
        out.append(name)
    return tuple(out)


def _check_float(call: str, name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise UsageError(format_error(call, f"{name}=None or a number >= 0", f"{value!r} ({type(value).__name__})",
                                      fix=f"e.g. {name}=1e-4"))
    return float(value)


def enable_cpu_compare(atol: float | None = None, rtol: float | None = None, ops: Iterable[str] | None = None,
                       *, routes: Iterable[str] | None = None, mode: str = "raise") -> None:
    """Re-run ops on the CPU and report the first whose result differs (see the module doc).

    ``ops``: names or globs (``"aten::log"`` = all its overloads); None = every op.
    ``routes``: only ops routed so on the target (e.g. ``("composite", "yours")``).
    ``atol``/``rtol``: None = torch.testing's defaults for the output's dtype.
    """
    call = "torch_adapter.debug.enable_cpu_compare()"
    _check_mode("torch_adapter.debug.enable_cpu_compare(mode=...)", mode)
    atol, rtol = _check_float(call, "atol", atol), _check_float(call, "rtol", rtol)
    wanted = _check_ops(ops)
    picked = None
    if routes is not None:
        picked = frozenset([routes] if isinstance(routes, str) else routes)
        if not picked or not picked <= set(_ROUTES):
            raise UsageError(format_error("torch_adapter.debug.enable_cpu_compare(routes=...)",
                                          f"a non-empty subset of {_ROUTES}", repr(routes),
                                          fix='routes=("composite", "yours")'))
    forget_warned("cpu_compare")
    _tool_mode.enable("cpu_compare", _CpuCompare(atol, rtol, wanted, picked, mode))
    _close_with_session()


def disable_cpu_compare() -> None:
    """Stop comparing with the CPU (safe to call when off)."""
    _tool_mode.disable("cpu_compare")
