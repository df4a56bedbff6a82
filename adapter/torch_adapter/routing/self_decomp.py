"""Does an op's ``torch._decomp`` decomposition call the op itself?

Many decompositions are PyTorch's reference implementations: ``aten::var.correction``
becomes ``prims::var``, and the prim's eager implementation (``impl_aten``) is ``torch.var``
again — on a device without a ``var`` kernel the decomposition only re-enters the op, and
the engine declines it and runs the call on the CPU. :func:`calls_itself` finds that out
once per op, before anything runs, so ``explain()`` and execution agree: it runs the
decomposition on small CPU sample inputs built from the op's schema under a dispatch mode
that records every op called (prims expanded into their ``impl_aten``), and answers whether
the op itself was among them. Ops whose samples cannot be built or run answer None
(unknown: the decomposition is kept and the engine still declines at run time if needed).
The probe runs under :func:`~.internal.internal`: no routing report counts its ops.

:func:`decided` is the pure decision (:func:`.decide.decide`) completed with the probe's
answer: a decomposition that re-enters its op is no composite route.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from . import route_cache
from .decide import RouteDecision, decide
from .dispatch_state import state
from ..core.threads import one_thread
from .internal import internal

__all__ = ["calls_itself", "decided", "sample_args"]

_SHAPE = (2, 3, 4, 4)  # N, C, H, W: pools, convolutions, norms and elementwise ops all take it
_PER_CHANNEL = ("weight", "bias", "running_mean", "running_var", "mean", "invstd", "rstd", "save_mean",
                "save_invstd", "save_var")


def _tensor(torch: Any, name: str) -> Any:
    if name in ("index", "indices", "target", "offsets"):
        return torch.zeros(_SHAPE, dtype=torch.long)
    if name in ("mask", "condition"):
        return torch.ones(_SHAPE, dtype=torch.bool)
    if name in _PER_CHANNEL:
        return torch.rand(_SHAPE[1]) + 0.5
    return torch.rand(_SHAPE) + 0.5


def _value(torch: Any, arg: Any) -> Any:
    if arg.has_default_value():
        return arg.default_value
    text = str(arg.type).replace("SymInt", "int").replace("number", "Scalar")
    optional = text.endswith("?") or text.startswith("Optional[")
    text = text.rstrip("?")
    if text.startswith("Optional["):
        text = text[len("Optional["):-1]
    if text.startswith("List[") and text.endswith("]"):
        text = text[len("List["):-1] + "[]"
    name = arg.name
    if text == "Tensor":
        return _tensor(torch, name)
    if text == "Tensor[]":
        return [_tensor(torch, name), _tensor(torch, name)]
    if optional:
        return None
    if text == "int":
        return 1
    if text.startswith("int["):
        if "size" in name or "shape" in name:
            return list(_SHAPE)
        return [1] if "dim" in name else [2, 2]
    if text == "float":
        return 0.5
    if text == "bool":
        return False
    if text.startswith("bool["):
        return [True, True, True]
    if text == "Scalar":
        return 1.7  # not 0, 1, 2 or 0.5: decompositions special-case those (pow(x, 2) -> x * x)
    if text == "str" and name != "reduce":  # scatter's deprecated reduce= warns from C++
        return "none"
    raise TypeError(f"no sample for {arg.name}: {arg.type}")


def sample_args(op: Any) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword sample arguments for ``op`` (an OpOverload), from its schema."""
    import torch

    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for arg in op._schema.arguments:
        value = _value(torch, arg)
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return args, kwargs


class _Probing(threading.local):
    """The probes running on *this* thread: a cycle is a re-entry on the same thread. (One global
    set made a probe of the same op running concurrently on another thread look like a cycle, and
    the unknown answer was cached for good.)"""

    def __init__(self) -> None:
        self.now: set[tuple[str, Any]] = set()


_PROBING = _Probing()


@functools.lru_cache(maxsize=None)
def calls_itself(name: str, profile: Any = None) -> bool | None:
    """True when the decomposition of ``name`` calls ``name`` (checked once per op and profile).

    With a ``profile``, the ops the decomposition calls are expanded as the engine would run
    them on that target (their own decomposition or CompositeExplicit kernel when the target
    lacks a kernel), so a re-entry through another op's pieces counts too."""
    if profile is not None:
        stored = route_cache.probe(name, profile)  # found in an earlier run (the start-up cache)
        if stored is not route_cache.UNKNOWN:
            return stored
    if (name, profile) in _PROBING.now:  # a cycle between two decompositions: unknown here
        return None
    _PROBING.now.add((name, profile))
    try:
        # the probe's ops are the adapter's, not the user's: no observer counts them, and they never
        # start OpenMP's thread team in the program's process (core/threads.py: a fork after it hangs)
        with internal(), one_thread():
            return _probe(name, profile)
    finally:
        _PROBING.now.discard((name, profile))


def _probe(name: str, profile: Any) -> bool | None:
    from ..core import torch_private as tp
    from . import ops_table

    table = tp.decompositions()
    fn = table.get(name)
    if fn is None:
        return False
    try:
        op = tp.resolve_op(name)
    except AttributeError:
        return None
    stack = [name]
    found: list[bool] = []

    def how(func: Any) -> str | None:
        return None if profile is None else decided(func.name(), profile).via

    class Probe(tp.dispatch_mode_base()):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            kw = kw or {}
            op_name = func.name()
            if op_name in stack:
                if op_name == name:
                    found.append(True)
                return func(*a, **kw)
            impl = getattr(func, "impl_aten", None) if func.namespace == "prims" else None
            if impl is not None:  # a prim: what it really runs
                with self:
                    return impl(*a, **kw)
            via = how(func) if func.namespace == "aten" else None
            if via == "torch._decomp" and op_name in table:
                stack.append(op_name)
                try:
                    with self:
                        return table[op_name](*a, **kw)
                finally:
                    stack.pop()
            if via in ops_table.EXPLICIT_KEYS:
                with self:
                    return tp.call_composite_explicit(func, via, a, kw)
            return func(*a, **kw)

    from ..core.caller_warnings import silenced

    state.bypass += 1  # an installed engine runs host kernels, unrouted and unrecorded
    try:
        with tp.no_dispatch_modes(), silenced():  # no trace() recorder sees the probe, nor the user its warnings
            try:
                args, kwargs = sample_args(op)
            except (TypeError, RuntimeError):
                return None
            with Probe():
                fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a sample the decomposition rejects: unknown (unless seen)
        return True if found else None
    finally:
        state.bypass -= 1
    return bool(found)


def decided(name: str, profile: Any, registry: Any = None, policy: Any = None) -> RouteDecision:
    """The route of ``name`` on ``profile``, the probe consulted where the decision rests on a
    ``torch._decomp`` decomposition (only there: the probe runs once per op and profile)."""
    d = decide(name, profile, registry, policy)
    if d.via == "torch._decomp" and calls_itself(name, profile):
        d = decide(name, profile, registry, policy, frozenset({name}))
    return d
