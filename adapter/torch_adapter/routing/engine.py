"""Enforcement: ops the target lacks really run their route.

Mechanism (measured against a TorchDispatchMode, see docs/routing.md): a Python kernel is
registered — with ``torch.library``, below autograd — only for the ops whose route differs
from what the executing device does anyway. Every other op never leaves C++, which is
what keeps a simulated target close to plain speed:

- *simulated* targets execute on the host (CPU): overrides sit on the host's key and call
  its original kernel (``torch.library.get_kernel``) when the route says CPU;
- *real* targets: overrides sit on the target's key, where the op has no kernel. A real device
  target always has an engine (session.py): an op it lacks that a ``torch._decomp`` decomposition
  covers is decomposed, as its route says, instead of reaching the device's own CPU fallback;
  an op with no decomposition is left to that fallback unless the policy asks otherwise.

An overridden op runs, in the order of :mod:`.decide`: a registered kernel; its own
CompositeExplicitAutograd kernel; a ``torch._decomp`` decomposition (each piece routed
again, recursion guarded); or the CPU fallback — inputs copied to the CPU, the op run
there unrouted, results copied back, mutated arguments written back in place, bytes counted
each way. Views, metadata and copy ops are never overridden (they must alias the device's
tensors). ``attach(session)`` is called by the session and returns the :class:`Engine`.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

from ..core import torch_private as tp
from ..errors import FallbackError
from . import ops_table, rules
from .choose import decide_name, remember
from .decide import Route, RouteDecision, refused, unrefused
from .dispatch_state import state
from .internal import active as internal_active
from .log import RoutingLog
from .policy import FallbackCounter, Policy, make_policy

__all__ = ["Engine", "attach", "state"]




def _map(obj: Any, fn: Callable[[Any], Any], kind: type) -> Any:
    if isinstance(obj, kind):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, fn, kind) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn, kind) for k, v in obj.items()}
    return obj


class Engine:
    """The routing engine of one session: decisions, overrides, logs. ``detach()`` undoes all."""

    def __init__(self, session: Any) -> None:
        import torch

        tp.check_routing_support()
        self._torch = torch
        self.session = session
        self.target = session.target
        from .profiles import profile_for

        self.profile = profile_for(session.target)
        self.simulated = bool(session.target.simulated)
        self.key = tp.dispatch_key_for_device(session.target.device_type) if self.simulated \
            else session.target.dispatch_key
        self.device = session.target.device()
        self.on_cpu_key = self.key == "CPU"  # overrides replace CPU kernels: call the originals
        self.log = RoutingLog(session.target.name, self.simulated)  # the whole session's log
        self.logs: list[RoutingLog] = [self.log]
        self.counter = FallbackCounter(session.target.label)
        self.policy = Policy()
        self._config: Any = None  # the last config applied
        self.overrides: dict[str, RouteDecision] = {}
        self._libs: dict[str, Any] = {}
        self._originals: dict[Any, Any] = {}  # op (or (op, autograd key)) -> the host kernel our override replaced
        self._lock = threading.RLock()
        from .dtype_check import DtypeCheck

        self.dtype_check = DtypeCheck(self)  # dtypes the real target refuses (simulated targets)
        self.log.dtype_note = self._dtype_note()

    # -- lifecycle ---------------------------------------------------------------------------
    def reconfigure(self, config: Any) -> None:
        """Apply the config's ``fallback``/``force_cpu``/``deny`` now. They are checked first:
        on an error nothing changes (the session's config is put back to the last good one)."""
        try:
            policy = make_policy(config, self.profile)
        except Exception:
            if self._config is not None:
                self.session.config = self._config
            raise
        with self._lock:
            self.policy, self._config = policy, config
            self._install()

    def refresh(self) -> None:
        """Re-read the registry (after a register_*/remove)."""
        with self._lock:
            self._install()

    def registered(self, name: str, key: str) -> None:
        """The program registered a kernel for op ``name`` at ``key`` (redirect/custom_ops.py's
        ``Library.impl``; a custom_op's definition registers its first). For one of the program's
        custom ops (routing/program_ops.py) the route may differ now: it is decided again, and the op
        is overridden from now on when its route needs it (the other overrides stay as they are). A
        kernel at this engine's own key went on top of the op's override: the override goes on top of
        it again, that kernel its new original."""
        from .choose import clear_caches
        from .decide import decide
        from .program_ops import ROUTE_NEUTRAL_KEYS, program_op

        if key.startswith(ROUTE_NEUTRAL_KEYS) or not program_op(name):
            return
        snap = self._registry()
        fresh = decide.__wrapped__(name, self.profile, snap, self.policy)  # the kernels changed: not the cache's
        if fresh.via == "torch._decomp" or fresh != decide_name(name, self.profile, snap, self.policy) \
                or decide.__wrapped__(name, self.profile) != decide_name(name, self.profile):
            clear_caches()  # a decision cached before this kernel (explain()'s too)
        with self._lock:
            needed, overridden = self._needs_override(fresh), name in self.overrides
            if needed and self._libs and (not overridden or key == self.key):
                # one kernel more, on top of the op's kernels now (the program's new one included); the
                # other overrides stay (deciding every op again costs ~20 ms a registration)
                for held in [k for k in self._originals if k == name or (isinstance(k, tuple) and k[0] == name)]:
                    del self._originals[held]
                self._register_overrides({name: (fresh, tp.resolve_op(name))})
            elif needed != overridden:
                self._install()  # an override no longer needed: every op's, again
                return
            if needed:
                self.overrides = {**self.overrides, name: fresh}

    def _dtype_note(self) -> str | None:
        """None on a real target (its backend judges); "" when the simulated profile has dtype
        data; otherwise why the preview cannot judge dtypes."""
        if not self.simulated:
            return None
        if self.profile.dtypes is None:
            return self.profile.dtype_note or f"no dtype data for {self.profile.name}"
        return "" if self.dtype_check.mode != "off" else 'configure(dtype_check="off")'

    def detach(self) -> None:
        """Remove every kernel this engine registered; torch dispatches as before."""
        with self._lock:
            self.dtype_check.detach()
            for lib in self._libs.values():
                lib._destroy()
            self._libs.clear()
            self.overrides.clear()

    def _registry(self) -> Any:
        from .registry import registry_of

        reg = registry_of(self.session, create=False)
        return reg.snapshot() if reg is not None else None

    def decide(self, op: Any) -> RouteDecision:
        """This session's decision for ``op`` (name or OpOverload)."""
        name = op.name() if hasattr(op, "_schema") else op
        return decide_name(name, self.profile, self._registry(), self.policy)

    def _candidates(self) -> set[str]:
        from .program_ops import program_ops

        # the aten ops, the program's custom ops (routed alike: their fallbacks copy, obey the policy and
        # record the user's line), less those the session serves a CUDA kernel for, and what the policy
        # or the registry names
        served = getattr(getattr(self.session, "custom_op_kernels", None), "libs", ())
        names = set(ops_table.load_table()) | program_ops(served) | set(self.policy.force_cpu) \
            | set(self.policy.deny)
        snap = self._registry()
        if snap is not None:
            names |= {op for op, _ in snap.accelerated} | set(snap.fallback)
        return names

    def _needs_override(self, d: RouteDecision) -> bool:
        if d.op in rules.ENGINE_OPS or d.via in ("view", "metadata", "device-selected", ops_table.COMPOSITE_IMPLICIT):
            return False
        if d.via == "register_accelerated" or d.via == "register_fallback" or d.via == "torch._decomp":
            return True
        if d.via in ops_table.EXPLICIT_KEYS:  # only where the device has its own kernel instead
            return tp.has_kernel_for_key(d.op, self.key) and tp.has_kernel_for_key(d.op, d.via)
        if d.route in (Route.FALLBACK, Route.REFUSED):  # only when the CPU can run it (else torch's error stands)
            if not self.simulated and d.route is Route.FALLBACK and self.policy.fallback == "allow" \
                    and d.op not in self.policy.force_cpu \
                    and d.op not in rules.DEVICE_REFUSING_COMPOSITES:
                # a real device's own fallback runs it (torch_npu's, the emulated device's: C++) — not where
                # a composite that only refuses the device holds the device's slot (mode.values)
                return False
            return tp.host_kernel(d.op, "CPU") is not None
        return False

    def _install(self) -> None:
        """(Re)register the overrides. Each kernel reads its op's decision from ``self.overrides``
        when called, so a new policy over the same ops (``configure(fallback=...)``) only replaces
        the decisions: no kernel is deregistered — deregistering a Python kernel while another
        thread runs it frees it under that thread (a crash in torch). When the set of ops changes,
        the new kernels go on top of the old ones before those are destroyed, so an op running on
        another thread meanwhile always meets one of them (never a gap where it would run unrouted)."""
        decided = self._decide_overrides()
        overrides = {name: d for name, (d, _) in decided.items()}
        if self._libs and overrides.keys() == self.overrides.keys():
            self.overrides = overrides
        else:
            old_libs, self._libs = self._libs, {}
            try:
                self._register_overrides(decided)
                self.overrides = overrides
            finally:
                for lib in old_libs.values():
                    lib._destroy()
        self.dtype_check.install(getattr(self._config, "dtype_check", "raise"))  # on top of the overrides
        for log in self.logs:
            log.dtype_note = self._dtype_note()

    def _decide_overrides(self) -> dict[str, tuple[RouteDecision, Any]]:
        """op name -> (its decision, its OpOverload) for every op this session must override now."""
        decided: dict[str, tuple[RouteDecision, Any]] = {}
        snap = self._registry()
        for name in sorted(self._candidates()):
            d = decide_name(name, self.profile, snap, self.policy)
            if not self._needs_override(d):
                continue
            try:
                decided[name] = (d, tp.resolve_op(name))
            except AttributeError:  # in the YAML but not built into this torch
                continue
        remember(self.profile, ops_table.load_table(), snap, self.policy)  # decided: into the start-up cache
        return decided

    def _register_overrides(self, decided: dict[str, tuple[RouteDecision, Any]]) -> None:
        for name, (d, op) in decided.items():
            above = self._autograd_key(d)
            if name not in self._originals:  # fetched before our first kernel for it sits on top
                self._originals[name] = tp.host_kernel(name, self.key)
            if above is not None and (name, above) not in self._originals:  # (the backend's kernel changes it)
                self._originals[(name, above)] = tp.host_kernel(name, above)
            original = self._originals[name]
            ns = name.partition("::")[0]
            lib = self._libs.get(ns) or self._libs.setdefault(ns, tp.kernel_library(ns))
            tp.register_python_kernel(lib, name, self._kernel(d, op, original), self.key)
            if above is not None:
                # An op that decomposes above autograd (CompositeImplicitAutograd: einsum) has no backward
                # of its own: a kernel at the backend key alone took the op out of autograd (torch's "an
                # autograd kernel was not registered" fallback; its gradient lost under `run --report`).
                # Sent to the CPU (a profile's or configure(force_cpu=...)'s forced fallback), it runs one
                # level up, where its copies to and from the CPU and its pieces there are recorded for backward.
                tp.register_python_kernel(lib, name, self._kernel(d, op, self._originals[(name, above)]), above)

    def _autograd_key(self, d: RouteDecision) -> str | None:
        """The autograd key above the target's backend key for a CPU-bound CompositeImplicitAutograd op
        (None for every other op: their kernels below autograd have derivatives of their own)."""
        if d.route not in (Route.FALLBACK, Route.REFUSED) or not tp.has_kernel_for_key(d.op, ops_table.COMPOSITE_IMPLICIT):
            return None
        key = f"Autograd{self.key}"
        return key if hasattr(self._torch._C.DispatchKey, key) else None

    # -- execution ---------------------------------------------------------------------------
    def _kernel(self, d: RouteDecision, op: Any, original: Any) -> Callable[..., Any]:
        """The override of ``d.op``: runs its current decision (``d`` until the first is published,
        and for a kernel a later set of ops has replaced, while a thread may still reach it)."""
        name = d.op

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            return self.run(self.overrides.get(name, d), op, original, keyset, args, kwargs)

        kernel.__name__ = f"torch_adapter_{d.route.value}_{d.op}"
        return kernel

    def run(self, d: RouteDecision, op: Any, original: Any, keyset: Any, args: tuple, kwargs: dict) -> Any:
        st = state
        if st.bypass:  # inside a CPU fallback: the op runs as the CPU runs it, unrouted, unrecorded
            if self.on_cpu_key:
                return self._host(op, original, keyset, args, kwargs)
            return self._fallback(op, original, keyset, args, kwargs)[0]
        counted = st.recorded == d.op
        st.recorded = None
        saved_child, st.child_ns = st.child_ns, 0
        copied = (0, 0)
        t0 = time.perf_counter_ns()
        try:
            if d.via == "torch._decomp":
                out = NotImplemented
                if d.op in st.stack:  # the decomposition calls the op itself
                    d = _declined(d, "its torch._decomp decomposition calls the op itself")
                elif d.op in rules.DECLINED_DECOMPOSITIONS and rules.DECLINED_DECOMPOSITIONS[d.op][0](args):
                    d = _declined(d, rules.DECLINED_DECOMPOSITIONS[d.op][1] + " (these arguments)")
                else:
                    try:
                        out = self._decompose(d, op, args, kwargs)
                    except (RuntimeError, IndexError, ValueError, TypeError) as exc:
                        if isinstance(exc, (FallbackError, self._torch.OutOfMemoryError)) or _written(op) \
                                or _device_mixing(exc):
                            raise
                        # the reference refused these arguments: the kernel's own answer (its message, which
                        # CUDA's kernel shares, or its result where the reference is stricter)
                        d = _declined(d, "its torch._decomp decomposition raised for these arguments")
                        try:
                            out, copied = self._cpu(d, op, original, keyset, args, kwargs)
                        except FallbackError:
                            raise exc from None
                    if out is NotImplemented:
                        d = _declined(d, "its torch._decomp decomposition returned NotImplemented for these arguments")
                if out is NotImplemented:
                    out, copied = self._cpu(d, op, original, keyset, args, kwargs)
            elif d.via in ops_table.EXPLICIT_KEYS:
                out = self._pieces(d, tp.call_composite_explicit, op, d.via, args, kwargs)
            elif d.via in ("register_fallback", "register_accelerated"):
                out = self._registered(d, args, kwargs)
            else:
                out, copied = self._cpu(d, op, original, keyset, args, kwargs)
        except FallbackError:  # the policy refused the CPU for this op: the call is logged as refused
            if d.route in (Route.FALLBACK, Route.REFUSED):
                self._log(refused(d, self.policy), counted, 0, (0, 0))
            raise
        finally:
            dt = time.perf_counter_ns() - t0
            children, st.child_ns = st.child_ns, saved_child + dt
        self._log(d, counted, dt - children, copied)
        return out

    def _log(self, d: RouteDecision, counted: bool, self_ns: int, copied: tuple[int, int]) -> None:
        st = state
        if counted:
            st.decided = d
        if internal_active():  # torch_adapter's own work (routing/internal.py): routed, not logged
            return
        # the recorder already counts this call in its own logs; every other log counts it here
        rec_logs = st.recorder.logs if counted and st.recorder is not None else ()
        for log in self.logs:
            log.add_decision(d, calls=0 if any(log is r for r in rec_logs) else 1, self_time_ns=self_ns,
                             bytes_to_cpu=copied[0], bytes_from_cpu=copied[1], parent=st.parent, find_site=True)

    def _host(self, op: Any, original: Any, keyset: Any, args: tuple, kwargs: dict) -> Any:
        """Run ``op`` as the CPU runs it: the host kernel we replaced (simulated targets and the
        CPU target), or a plain call on CPU tensors (other real targets: the CPU key is ours not)."""
        if not self.on_cpu_key:
            return op(*args, **kwargs)
        if original is None:
            raise NotImplementedError(f"{op.name()}: the CPU has no kernel for it, so its fallback cannot run")
        return original.call_boxed(keyset, *args, **kwargs)

    def _pieces(self, d: RouteDecision, fn: Callable[..., Any], *call: Any) -> Any:
        st = state
        parent, st.parent = st.parent, d.op
        try:
            if st.recorder is not None and st.popped:  # put the recorder back: pieces are recorded
                st.popped = False
                try:
                    with st.recorder:
                        return fn(*call)
                finally:
                    st.popped = True
            return fn(*call)
        finally:
            st.parent = parent

    def _decompose(self, d: RouteDecision, op: Any, args: tuple, kwargs: dict) -> Any:
        st = state
        st.stack.append(d.op)
        try:
            fn = tp.decompositions()[d.op]
            _native_checks(d.op, op, args, kwargs)
            if not self.simulated:
                args, kwargs = self._host_scalars(op, args, kwargs)
            return self._pieces(d, lambda: fn(*args, **kwargs))
        finally:
            st.stack.pop()

    def _host_scalars(self, op: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A real device target: host zero-dim tensors read next to the device's tensors go to the device
        before a decomposition runs. The native kernels take them as scalars (TensorIterator: a CPU
        scalar is an input a CUDA kernel accepts); a reference may check devices more strictly
        (torch._refs.copysign refused ``copysign(torch.tensor(1.0), device_t)``: 'Expected divisor (b)
        to be on the same device'). A written argument (out=, in-place self) is never moved."""
        Tensor = self._torch.Tensor
        dev_type = self.device.type

        def tensors(v: Any) -> list[Any]:
            return [v] if isinstance(v, Tensor) else [t for t in v if isinstance(t, Tensor)] \
                if isinstance(v, (list, tuple)) else []

        values = [*args, *kwargs.values()]
        if not any(t.device.type == dev_type for v in values for t in tensors(v)):
            return args, kwargs
        if not any(t.device.type == "cpu" and t.dim() == 0 for v in values for t in tensors(v)):
            return args, kwargs
        written = {name for _, name in _written(op)}
        names = [a.name for a in op._schema.arguments]

        def move(name: str, v: Any) -> Any:
            if name in written or not isinstance(v, Tensor) or v.device.type != "cpu" or v.dim() != 0:
                return v
            return v.to(self.device)

        args = tuple(move(names[i] if i < len(names) else "", v) for i, v in enumerate(args))
        kwargs = {k: move(k, v) for k, v in kwargs.items()}
        return args, kwargs

    def _registered(self, d: RouteDecision, args: tuple, kwargs: dict) -> Any:
        from .registry import registry_of

        reg = registry_of(self.session, create=False)
        kind = "accelerated" if d.via == "register_accelerated" else "fallback"
        fn = reg.function(kind, d.op, self.profile.name if kind == "accelerated" else None) if reg else None
        if fn is None:  # removed while the kernel was still registered
            raise RuntimeError(f"{d.op}: its register_{kind} implementation was removed")
        return self._pieces(d, lambda: fn(*args, **kwargs))

    def _cpu(self, d: RouteDecision, op: Any, original: Any, keyset: Any, args: tuple,
             kwargs: dict) -> tuple[Any, tuple[int, int]]:
        """The CPU fallback under the session's policy (raise / warn / count)."""
        self.counter.check(self.policy, unrefused(d))
        out, copied = self._fallback(op, original, keyset, args, kwargs)
        self.counter.count(self.policy, d, copied[0] + copied[1])
        return out, copied

    def _fallback(self, op: Any, original: Any, keyset: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple[int, int]]:
        """Copy tensors to the CPU, run the op there, copy results back; mutated arguments are
        written back in place and returned as themselves. Returns (out, (bytes in, bytes out)).

        Simulated on a CPU host, "the device" is the CPU too: tensors are cloned each way so
        the copies (and their cost) are real. On the real CPU target nothing is copied."""
        torch = self._torch
        Tensor = torch.Tensor
        mode = "none" if self.on_cpu_key and not self.simulated else ("clone" if self.on_cpu_key else "move")
        moved: dict[int, Any] = {}
        back: dict[int, Any] = {}
        nbytes = [0, 0]

        def to_cpu(t: Any) -> Any:
            if id(t) in moved:
                return moved[id(t)]
            if mode == "none" or (mode == "move" and t.device.type == "cpu"):
                return t
            c = t.clone() if mode == "clone" else t.to("cpu")
            nbytes[0] += t.nbytes
            moved[id(t)] = c
            back[id(c)] = t
            return c

        def to_device(c: Any) -> Any:
            if id(c) in back:  # returned a (mutated) input: give back the original
                return back[id(c)]
            if mode == "none":
                return c
            nbytes[1] += c.nbytes
            return c.clone() if mode == "clone" else c.to(self.device)

        st = state
        st.bypass += 1
        try:
            cargs = _map(args, to_cpu, Tensor)
            ckwargs = _map(kwargs, to_cpu, Tensor)
            if mode == "move" and ckwargs.get("device") is not None:
                ckwargs["device"] = torch.device("cpu")
            try:
                out = self._host(op, original, keyset, cargs, ckwargs)
            except NotImplementedError as exc:
                out = self._widened(exc, op, original, keyset, cargs, ckwargs)
            schema = op._schema.arguments
            values = (*args, *[kwargs.get(a.name) for a in schema[len(args):]])
            for arg, value in zip(schema, values):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    _map(value, lambda t: _write_back(t, moved, nbytes), Tensor)
            result = _map(out, to_device, Tensor)
        finally:
            st.bypass -= 1
        return result, (nbytes[0], nbytes[1])

    def _widened(self, exc: NotImplementedError, op: Any, original: Any, keyset: Any, cargs: tuple,
                 ckwargs: dict) -> Any:
        """A fallback whose CPU kernel has no float16/bfloat16 case ("not implemented for 'Half'": the
        CPU's multi_margin_loss, multilabel_margin_loss_backward, ... where the device and CUDA have one):
        computed in float32 on the CPU, its results rounded to the arguments' dtype. Not for ops that write
        an argument; any other error is the kernel's."""
        torch = self._torch
        low = {"'Half'": torch.float16, "'BFloat16'": torch.bfloat16}
        named = next((dt for word, dt in low.items() if f"not implemented for {word}" in str(exc)), None)
        dtypes: set[Any] = set()
        _map((cargs, ckwargs), lambda t: dtypes.add(t.dtype), torch.Tensor)
        if named is None or _written(op) or named not in dtypes:
            raise exc

        def widen(t: Any) -> Any:
            return t.float() if t.dtype == named else t

        out = self._host(op, original, keyset, _map(cargs, widen, torch.Tensor), _map(ckwargs, widen, torch.Tensor))
        return _map(out, lambda t: t.to(named) if t.dtype == torch.float32 else t, torch.Tensor)

    # -- recording ----------------------------------------------------------------------------
    def add_log(self, log: RoutingLog) -> None:
        with self._lock:
            if log.dtype_note is None:
                log.dtype_note = self._dtype_note()
            self.logs = [*self.logs, log]

    def remove_log(self, log: RoutingLog) -> None:
        with self._lock:
            self.logs = [x for x in self.logs if x is not log]

    def __repr__(self) -> str:
        return (f"<routing Engine {self.target.label}: {len(self.overrides)} ops overridden on {self.key}, "
                f"fallback={self.policy.fallback!r}>")


@functools.lru_cache(maxsize=None)
def _declined(d: RouteDecision, why: str) -> RouteDecision:
    return RouteDecision(d.op, Route.FALLBACK, f"{d.reason.split(';')[0]}; {why}, so this call runs on the CPU", "cpu")


def _device_mixing(exc: BaseException) -> bool:
    """A decomposition's piece met tensors on two devices: the program's error, which the host kernel
    (every tensor copied to the CPU) would not see."""
    return "same device" in str(exc) or "device type" in str(exc)


@functools.lru_cache(maxsize=None)
def _written(overload: Any) -> tuple[tuple[int, str], ...]:
    """(position, name) of the arguments ``overload``'s schema marks written (out=, in-place self):
    read once per op, not per call."""
    return tuple((i, a.name) for i, a in enumerate(overload._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _native_checks(op: str, overload: Any, args: tuple, kwargs: dict) -> None:
    """The native kernel's argument checks its decomposition lacks (:data:`rules.NATIVE_CHECKS`, and
    the written-to tensor's internal overlap every kernel but :data:`rules.OVERLAP_WARNS` refuses):
    torch's own error, as the kernel raises it."""
    import torch

    base = op.partition("::")[2].partition(".")[0].rstrip("_")
    if base not in rules.OVERLAP_WARNS:
        for i, name in _written(overload):
            v = args[i] if i < len(args) else kwargs.get(name)
            if isinstance(v, torch.Tensor) and torch._debug_has_internal_overlap(v) == 1:  # MemOverlap::Yes
                raise RuntimeError(rules.INTERNAL_OVERLAP_MESSAGE)
    check = rules.NATIVE_CHECKS.get(base)
    if check is None:
        return
    kind, message = check
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    if kind == "same_dtype" and len({t.dtype for t in tensors}) > 1:
        raise RuntimeError(message)


def _write_back(orig: Any, moved: dict[int, Any], nbytes: list[int]) -> None:
    c = moved.get(id(orig))
    if c is None or c is orig:
        return
    if orig.shape != c.shape:
        orig.resize_(c.shape)
    orig.copy_(c)
    nbytes[1] += c.nbytes


def attach(session: Any) -> Engine:
    """Called by the session when ops must be enforced; returns the engine (the handle)."""
    engine = Engine(session)
    engine.reconfigure(session.config)
    mapper = getattr(session, "device_mapper", None)
    if mapper is not None and session.target.simulated:  # moves that run no op: checked as the real copy would be
        from .dtype_check import check_moved

        mapper.moved_hook = check_moved
    return engine
