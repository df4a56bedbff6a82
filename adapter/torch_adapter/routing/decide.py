"""Route decisions: plain data, a pure function of (op, profile, registry, policy).

Order (measured to reproduce plain results bit-for-bit: docs/figures/README.md#route-order):

1. a kernel registered with ``register_accelerated`` for this target   -> NATIVE
2. the target's own kernel                                               -> NATIVE
3. a view or metadata op (no kernel needed)                              -> NATIVE
4. forced to the CPU (profile ``fallback`` / ``configure(force_cpu=)``)  -> FALLBACK
5. a Python implementation from ``register_fallback``                    -> YOURS (on the device)
6. the op's own CompositeExplicitAutograd / CompositeImplicitAutograd kernel -> COMPOSITE
7. a ``torch._decomp`` decomposition not on the training-unsafe deny-list and that does not
   call the op itself (:mod:`.self_decomp`, checked once per op)      -> COMPOSITE
8. a device-essential op (allocation, copy, scalar read: every backend has it) -> NATIVE
9. otherwise: copy to the CPU, run there, copy back                      -> FALLBACK

A FALLBACK the session's policy does not allow (``fallback="error"``, ``deny=[...]``) is
REFUSED: the call raises :class:`~torch_adapter.errors.FallbackError` instead.

Before all of them, on a simulated target, a kernel the CPU host selected inside another op
(``mkldnn_rnn_layer`` under ``lstm``) is routed as the target's own member of its family
(:mod:`.kernel_families`), with the host's kernel named in the reason.

:func:`choose_route` is cached; :func:`explain` is its user-facing form.
"""

from __future__ import annotations

import difflib
import enum
import functools
from dataclasses import dataclass
from typing import Any

from ..core.torch_private import all_op_names, decompositions, has_kernel_for_key
from ..errors import UsageError, format_error
from . import kernel_families, ops_table, rules, self_decomp

__all__ = ["Route", "RouteDecision", "choose_route", "decide_name", "explain", "op_name",
           "known_op_names", "is_known_op", "clear_caches"]


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

    def __str__(self) -> str:
        return f"{self.op} -> {self.route.value} ({self.reason})"


# -- op names ------------------------------------------------------------------------------
def known_op_names() -> frozenset[str]:
    """Every op name the table or the dispatcher knows (custom ops registered later included)."""
    return frozenset(ops_table.load_table()) | frozenset(all_op_names())


_KNOWN: list[frozenset[str]] = []
_NOT_OPS: set[str] = set()  # names seen that are no op (profiler ranges such as "autograd::engine::...")


def is_known_op(name: str) -> bool:
    """``name in known_op_names()``, cheap on a hot path (after every notebook cell): the set is
    cached and re-read from the dispatcher only for a name it has not seen (an op registered
    since); names that are no op are remembered as such (an op observed was registered first)."""
    if _KNOWN and name in _KNOWN[0]:
        return True
    if name in _NOT_OPS:
        return False
    _KNOWN[:] = [known_op_names()]
    if name in _KNOWN[0]:
        return True
    _NOT_OPS.add(name)
    return False


@functools.lru_cache(maxsize=1)
def _namespaces() -> frozenset[str]:
    return frozenset(n.partition("::")[0] for n in all_op_names())


def _candidates(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("torch.ops."):
        text = text[len("torch.ops."):]
    if "::" not in text:
        head, dot, rest = text.partition(".")
        text = f"{head}::{rest}" if dot and head in _namespaces() else f"aten::{text}"
    if text.endswith(".default"):
        text = text[: -len(".default")]
    return [text]


def op_name(op: Any, *, call: str = "torch_adapter.explain()") -> str:
    """The canonical name of ``op`` (an OpOverload or a string); UsageError if unknown."""
    name_fn = getattr(op, "name", None)
    if callable(name_fn) and hasattr(op, "_schema"):
        return str(name_fn())
    if hasattr(op, "overloads") and hasattr(op, "_qualified_op_name"):  # an OpOverloadPacket
        return op_name(op._qualified_op_name, call=call)
    if not isinstance(op, str):
        raise UsageError(format_error(call, 'an op name such as "aten::nonzero" or an OpOverload',
                                      f"{op!r} ({type(op).__name__})",
                                      fix='pass e.g. "aten::add.Tensor" or torch.ops.aten.add.Tensor'))
    names = known_op_names()
    (name,) = _candidates(op)
    if name in names:
        return name
    overloads = sorted(n for n in names if n.startswith(name + "."))
    if overloads:
        raise UsageError(format_error(
            call, "one overload of the op", f"{op!r}, which names {len(overloads)} overloads",
            why="routes differ per overload", fix=f"name one of: {', '.join(overloads[:8])}"))
    close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.75)
    raise UsageError(format_error(
        call, 'an op this torch knows, e.g. "aten::nonzero" or "aten::add.Tensor"', repr(op),
        why="no operator of that name is registered",
        fix=f"did you mean {' or '.join(close)}?" if close else
        "list op names with torch._C._dispatch_get_all_op_names()"))


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


def _device_selected(name: str, profile: Any, registry: Any, policy: Any) -> RouteDecision | None:
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
    d = decide_name(op, profile, registry, policy)
    part = "" if role == "forward" or member.backward else " (its backward: autograd through it)"
    reason = (f"{d.reason}. Device-selected kernel: {family.selector} picks {op}{part} ({member.backend}) on "
              f"{profile.name}; this host ran its own {name} in its place")
    return RouteDecision(op, d.route, reason, "device-selected")  # the host kernel runs as it is


@functools.lru_cache(maxsize=1 << 16)
def decide_name(name: str, profile: Any, registry: Any = None, policy: Any = None) -> RouteDecision:
    """The route of the op called ``name`` on ``profile`` (cached; all arguments hashable).

    ``registry`` is a :class:`~torch_adapter.routing.registry.RegistrySnapshot` or None,
    ``policy`` a :class:`~torch_adapter.routing.policy.Policy` or None.
    """
    d = _decide(name, profile, registry, policy)
    if d.route is Route.FALLBACK and policy is not None:
        return refused(d, policy)
    return d


REFUSED_MARK = "; refused: "


def refused(d: RouteDecision, policy: Any) -> RouteDecision:
    """``d`` (a fallback) as the policy has it: REFUSED when ``fallback="error"`` or ``deny``
    names the op, else ``d`` itself."""
    if d.route is not Route.FALLBACK:
        return d
    if d.op in policy.deny:
        why = "the op is in configure(deny=...)"
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


def _decide(name: str, profile: Any, registry: Any, policy: Any) -> RouteDecision:
    selected = _device_selected(name, profile, registry, policy)
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
    if kind in ops_table.EXPLICIT_KEYS:
        return RouteDecision(name, Route.COMPOSITE, f"{lacks}; runs its {kind} kernel (written with other aten ops)",
                             kind)
    if kind == ops_table.COMPOSITE_IMPLICIT:
        return RouteDecision(name, Route.COMPOSITE,
                             f"{lacks}; CompositeImplicitAutograd: decomposes into other aten ops above autograd", kind)
    decomp = decompositions().get(name)
    unsafe = rules.TRAINING_UNSAFE_DECOMPOSITIONS.get(name)
    if decomp is not None and unsafe is None and self_decomp.calls_itself(name, profile):
        return RouteDecision(name, Route.FALLBACK, f"{lacks}; its torch._decomp decomposition calls the op itself "
                             "(found once, on sample inputs), so it runs on the CPU (inputs copied there, results back)",
                             "cpu")
    if decomp is not None and unsafe is None:
        return RouteDecision(name, Route.COMPOSITE, f"{lacks}; decomposes via torch._decomp ({_decomp_label(decomp)})",
                             "torch._decomp")
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


def choose_route(op: Any, profile: Any, registry: Any = None, policy: Any = None) -> RouteDecision:
    """The RouteDecision of ``op`` (OpOverload or name) on ``profile``. Pure and cached.

    ``registry`` may be a live :class:`~torch_adapter.routing.registry.Registry` (its
    current snapshot is used) or a snapshot.
    """
    name = op.name() if hasattr(op, "_schema") else op_name(op, call="choose_route()")
    snapshot = registry.snapshot() if hasattr(registry, "snapshot") else registry
    return decide_name(name, profile, snapshot, policy)


def clear_caches() -> None:
    """Forget cached decisions and op names (after registering new custom ops)."""
    decide_name.cache_clear()
    _KNOWN.clear()
    _NOT_OPS.clear()


# -- explain ---------------------------------------------------------------------------------
def _profile_of(target: Any) -> tuple[Any, Any, Any]:
    """(profile, registry, policy) for explain()'s ``target`` argument."""
    from ..core.state import current
    from .target import Target, _detect_one, KNOWN
    from . import profiles

    session = current()
    if target is None:
        if session is not None:
            target = session.target
        else:
            from .target import resolve

            target = resolve("auto")
    if isinstance(target, profiles.CapabilityProfile):
        profile = target
    elif isinstance(target, Target):
        profile = profiles.profile_for(target)
    elif isinstance(target, str):
        key = target.strip().lower()
        if session is not None and key == session.target.name:
            profile = profiles.profile_for(session.target)
        elif key in KNOWN and _detect_one(key).present:
            real = _detect_one(key)
            profile = profiles.live_profile(real.name, real.dispatch_key)
        else:
            profile = profiles.load_profile(target)
    else:
        raise UsageError(format_error(
            "torch_adapter.explain(op, target=...)", 'a target name ("mps"), a Target or a CapabilityProfile',
            f"{target!r} ({type(target).__name__})", fix='e.g. explain("aten::nonzero", target="mps")'))
    if session is not None and session.target.name == profile.name:
        from .policy import policy_of
        from .registry import registry_of

        reg = registry_of(session, create=False)
        return profile, (reg.snapshot() if reg is not None else None), policy_of(session)
    return profile, None, None


def explain(op: Any, target: Any = None) -> RouteDecision:
    """How ``op`` is routed on ``target``, and why — without running anything.

    ``op``: ``"aten::nonzero"``, ``"aten::add.Tensor"``, ``"nonzero"`` or an OpOverload.
    ``target``: a name (``"mps"`` previews the built-in profile unless an MPS device is
    present), a ``.toml`` profile, a Target or a CapabilityProfile; by default the
    installed target, or this machine's.

    >>> torch_adapter.explain("aten::_linalg_eigh", target="mps").route
    <Route.FALLBACK: 'fallback'>
    """
    name = op_name(op)
    profile, registry, policy = _profile_of(target)
    return decide_name(name, profile, registry, policy)
