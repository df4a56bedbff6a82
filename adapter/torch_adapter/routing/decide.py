"""Route decisions: plain data, a pure function of (op, profile, registry, policy).

Order (measured to reproduce plain results bit-for-bit: docs/figures/README.md#route-order):

1. a kernel registered with ``register_accelerated`` for this target   -> NATIVE
2. the target's own kernel                                               -> NATIVE
3. a view or metadata op (no kernel needed)                              -> NATIVE
4. forced to the CPU (profile ``fallback`` / ``configure(force_cpu=)``)  -> FALLBACK
5. a Python implementation from ``register_fallback``                    -> YOURS (on the device)
6. the op's own CompositeExplicitAutograd / CompositeImplicitAutograd kernel -> COMPOSITE
7. a ``torch._decomp`` decomposition not on the training-unsafe deny-list and not known to
   call the op itself (``self_calling``: what :mod:`.self_decomp` found) -> COMPOSITE
8. a device-essential op (allocation, copy, scalar read: every backend has it) -> NATIVE
9. otherwise: copy to the CPU, run there, copy back                      -> FALLBACK

A FALLBACK the session's policy does not allow (``fallback="error"``, ``deny=[...]``) is
REFUSED: the call raises :class:`~torch_adapter.errors.FallbackError` instead.

Before all of them, on a simulated target, a kernel the CPU host selected inside another op
(``mkldnn_rnn_layer`` under ``lstm``) is routed as the target's own member of its family
(:mod:`.kernel_families`), with the host's kernel named in the reason.

:func:`decide` is pure: its answer depends on its arguments alone — it reads no session, runs
no probe and dispatches nothing (the profile, registry snapshot, policy and the set of ops
whose decomposition calls themselves are plain data). The routes the engine takes are
:func:`.choose.decide_name`: this function completed with what the self-decomposition
probe finds; :func:`.explain.explain` is its user-facing form.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any

from ..core.torch_private import decompositions, has_kernel_for_key
from . import kernel_families, ops_table, rules

__all__ = ["Route", "RouteDecision", "decide", "refused", "unrefused"]


class Route(str, enum.Enum):
    """How an op runs on a target."""

    NATIVE = "native"
    COMPOSITE = "composite"
    YOURS = "yours"  # your register_fallback implementation, on the device
    FALLBACK = "fallback"
    REFUSED = "refused"  # a fallback the policy refuses: the call raises

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class RouteDecision:
    """One op's route on one target, and why. ``via`` names the mechanism."""

    op: str  # "aten::nonzero", "aten::add.Tensor"
    route: Route
    reason: str
    via: str | None = None

    @property
    def code(self) -> str:
        """The reason's stable code (``TA-F001``: core/codes.py, docs/reasons.md)."""
        from ..core.codes import route_code

        return route_code(self.route, self.via, self.reason)

    def __str__(self) -> str:
        return f"{self.op} -> {self.route.value} ({self.code}: {self.reason})"


# -- the decision ----------------------------------------------------------------------------
def _composite_kind(name: str) -> str | None:
    if name in rules.RAISING_COMPOSITES:  # a hook that only raises: no composite at all
        return None
    entry = ops_table.op_entry(name)
    if entry is not None:
        return ops_table.COMPOSITE_IMPLICIT if entry.composite_implicit else entry.composite_explicit
    for key in (ops_table.COMPOSITE_IMPLICIT, *ops_table.EXPLICIT_KEYS):
        if has_kernel_for_key(name, key):
            return key
    return None


def _out_variant_native(name: str, profile: Any) -> bool:
    """The out= variant of a structured op's functional/in-place overload is native on the target
    (``aten::argmax`` -> ``aten::argmax.out``, ``aten::scatter.src`` -> ``aten::scatter.src_out``)."""
    base, _, overload = name.partition(".")
    base = base.rstrip("_")
    outs = (f"{base}.{overload}_out", f"{base}.out") if overload else (f"{base}.out",)
    return any(profile.is_native(o) for o in outs)


def _is_view(name: str) -> bool:
    entry = ops_table.op_entry(name)
    return bool(entry and entry.view and not entry.mutates and not entry.composite_implicit)


def _cpu_can_run(name: str) -> bool:
    if name in rules.RAISING_COMPOSITES:
        return False
    entry = ops_table.op_entry(name)
    if entry is not None:
        return "CPU" in entry.keys or bool(entry.composite_explicit) or entry.composite_implicit
    return has_kernel_for_key(name, "CPU")


def _decomp_label(fn: Any) -> str:
    inner = getattr(fn, "__wrapped__", fn)
    if hasattr(inner, "_schema"):  # the table maps the op straight to another op
        return f"calls {inner.name()}"
    if hasattr(inner, "_qualified_op_name"):
        return f"calls {inner._qualified_op_name}"
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}"


def _target_member(family: Any, profile: Any) -> Any:
    """The member of ``family`` the target's device picks: the first whose kernel it has
    (CPU-only members never, unless the profile is the CPU's), else the family's generic path."""
    for member in family.members:
        if member.host_only and profile.dispatch_key != "CPU":
            continue
        if profile.is_native(member.forward):
            return member
    return family.generic


def _device_selected(name: str, profile: Any, registry: Any, policy: Any,
                     self_calling: frozenset[str]) -> RouteDecision | None:
    """On a simulated target, a kernel this host selected inside another op is routed as the
    target's own member of its family (:mod:`.kernel_families`); None when that is the op itself."""
    if profile.live or profile.dispatch_key == "CPU":
        return None
    hit = kernel_families.host_member(name)
    if hit is None:
        return None
    family, role = hit
    member = _target_member(family, profile)
    if member is None:
        return None  # the family has no generic path: the host op is every device's (batch norm)
    op = member.forward if role == "forward" or member.backward is None else member.backward
    if op == name:
        return None
    d = decide(op, profile, registry, policy, self_calling)
    part = "" if role == "forward" or member.backward else " (its backward: autograd through it)"
    reason = (f"{d.reason}. Device-selected kernel: {family.selector} picks {op}{part} ({member.backend}) on "
              f"{profile.name}; this host ran its own {name} in its place")
    return RouteDecision(op, d.route, reason, "device-selected")  # the host kernel runs as it is


@functools.lru_cache(maxsize=1 << 16)
def decide(name: str, profile: Any, registry: Any = None, policy: Any = None,
           self_calling: frozenset[str] = frozenset()) -> RouteDecision:
    """The route of the op called ``name`` on ``profile``: pure, so cached (all arguments hashable).

    ``registry`` is a :class:`~torch_adapter.routing.registry.RegistrySnapshot` or None,
    ``policy`` a :class:`~torch_adapter.routing.policy.Policy` or None, ``self_calling`` the
    ops known to re-enter themselves through their ``torch._decomp`` decomposition.
    """
    d = _decide(name, profile, registry, policy, self_calling)
    if d.route is Route.FALLBACK and policy is not None:
        return refused(d, policy)
    return d


REFUSED_MARK = "; refused: "


def refused(d: RouteDecision, policy: Any) -> RouteDecision:
    """``d`` (a fallback) as the policy has it: REFUSED when ``fallback="error"`` or ``deny``
    names the op or its reason's code, and ``allow`` names neither; else ``d`` itself."""
    if d.route is not Route.FALLBACK or policy.allowed(d):
        return d
    if d.op in policy.deny:
        why = "the op is in configure(deny=...)"
    elif policy.denied(d):
        why = f"its reason code {d.code} is in configure(deny=...)"
    elif policy.fallback == "error":
        why = 'the fallback policy is "error"'
    else:
        return d
    reason = d.reason.replace("runs on the CPU", "would run on the CPU", 1)
    return RouteDecision(d.op, Route.REFUSED, f"{reason}{REFUSED_MARK}{why}, so the call raises FallbackError", d.via)


def unrefused(d: RouteDecision) -> RouteDecision:
    """The fallback a REFUSED decision stands for (what the policy error message quotes)."""
    if d.route is not Route.REFUSED:
        return d
    reason = d.reason.split(REFUSED_MARK)[0].replace("would run on the CPU", "runs on the CPU", 1)
    return RouteDecision(d.op, Route.FALLBACK, reason, d.via)


def _decide(name: str, profile: Any, registry: Any, policy: Any, self_calling: frozenset[str]) -> RouteDecision:
    selected = _device_selected(name, profile, registry, policy, self_calling)
    if selected is not None:
        return selected
    key = profile.dispatch_key
    if registry is not None and (name, profile.name) in registry.accelerated:
        return RouteDecision(name, Route.NATIVE, f"kernel registered with register_accelerated(device={profile.name!r})",
                             "register_accelerated")
    native = profile.is_native(name)
    forced = name in profile.forced_fallback or (policy is not None and name in policy.force_cpu)
    if native and not forced:
        origin = getattr(profile, "why_native", {}).get(name)
        return RouteDecision(name, Route.NATIVE, f"{profile.name} has its own {key} kernel"
                             + (f" ({origin})" if origin else ""), key)
    if name in rules.METADATA_OPS:
        return RouteDecision(name, Route.NATIVE, f"metadata op: {rules.METADATA_OPS[name]}", "metadata")

    if _is_view(name):
        return RouteDecision(name, Route.NATIVE, rules.VIEW_REASON, "view")
    if forced:
        by = "configure(force_cpu=...)" if policy is not None and name in policy.force_cpu else \
            f"profile {profile.source}"
        return RouteDecision(name, Route.FALLBACK, f"forced to the CPU by {by}", "cpu")
    lacks = f"no {key} kernel" + (f" in the {profile.name} vendor op list" if getattr(profile, "listed", 0) else "")
    if registry is not None and name in registry.fallback:
        return RouteDecision(name, Route.YOURS, f"{lacks}; your register_fallback implementation runs it on the "
                             "device (nothing copied)", "register_fallback")
    kind = _composite_kind(name)
    refusing = rules.DEVICE_REFUSING_COMPOSITES.get(name)
    if kind in ops_table.EXPLICIT_KEYS and refusing is not None and key not in refusing[0]:
        return RouteDecision(name, Route.FALLBACK, f"{lacks}; {refusing[1]}; runs on the CPU (inputs copied there, "
                             "results back)", "cpu")
    if kind in ops_table.EXPLICIT_KEYS:
        return RouteDecision(name, Route.COMPOSITE, f"{lacks}; runs its {kind} kernel (written with other aten ops)",
                             kind)
    if kind == ops_table.COMPOSITE_IMPLICIT:
        return RouteDecision(name, Route.COMPOSITE,
                             f"{lacks}; CompositeImplicitAutograd: decomposes into other aten ops above autograd", kind)
    decomp = decompositions().get(name)
    unsafe = rules.TRAINING_UNSAFE_DECOMPOSITIONS.get(name)
    if decomp is not None and unsafe is None and name not in self_calling:
        return RouteDecision(name, Route.COMPOSITE, f"{lacks}; decomposes via torch._decomp ({_decomp_label(decomp)})",
                             "torch._decomp")
    if kind is None and _out_variant_native(name, profile) \
            and has_kernel_for_key(name, ops_table.COMPOSITE_EXPLICIT_NONFUNCTIONAL):
        # a structured op's functional/in-place variant: torchgen generates its
        # CompositeExplicitAutogradNonFunctional kernel (it calls the out= variant), which the YAML does not
        # declare; a device with only the out= kernel runs it so (argmax, scatter.src on Ascend's table) —
        # found on the emulated npu, where the log said "fallback" and the device never fell back
        return RouteDecision(name, Route.COMPOSITE, f"{lacks}; runs its {ops_table.COMPOSITE_EXPLICIT_NONFUNCTIONAL} "
                             "kernel (torch's generated one: the out= variant, routed again)",
                             ops_table.COMPOSITE_EXPLICIT_NONFUNCTIONAL)
    if decomp is not None and unsafe is None:
        return RouteDecision(name, Route.FALLBACK, f"{lacks}; its torch._decomp decomposition calls the op itself "
                             "(found once, on sample inputs), so it runs on the CPU (inputs copied there, results back)",
                             "cpu")
    if name in rules.ENGINE_OPS and unsafe is None:
        return RouteDecision(name, Route.NATIVE, rules.ESSENTIAL_REASON, "device-essential")
    reason = f"{lacks} and no decomposition; runs on the CPU (inputs copied there, results back)"
    if unsafe is not None:
        reason = f"{lacks}; its torch._decomp decomposition is on the training-unsafe deny-list ({unsafe}); runs on the CPU"
    if name in rules.RAISING_COMPOSITES:
        reason += f"; {rules.RAISING_COMPOSITES[name]}"
    if not _cpu_can_run(name):
        reason += "; the CPU has no kernel either, so the op fails there too"
    host_note = rules.host_selected(name)
    if host_note:  # eager code on the real target would not call it; an exported graph would
        reason += f". Note: {host_note}"
    return RouteDecision(name, Route.FALLBACK, reason, "cpu")
