"""Fallback policy: ``configure(fallback="allow"|"warn"|"error", force_cpu=[...], deny=[...])``.

- ``fallback="allow"`` runs ops the target lacks on the CPU silently (counted in the log);
- ``"warn"`` warns with a :class:`FallbackWarning` that carries the op's running count and
  bytes copied — at its 1st, 2nd, 4th, 8th ... call, never silenced after the first;
- ``"error"`` raises :class:`~torch_adapter.errors.FallbackError` naming the op, the target,
  the reason and the ways out;
- ``force_cpu`` sends ops to the CPU even when the target has them (a buggy kernel);
- ``deny`` makes those ops an error whenever they would run on the CPU, whatever
  ``fallback`` says.

Op names are checked when the policy is made: unknown names raise UsageError, names of
ops the target runs natively warn (the policy would have no effect, or — for
``force_cpu`` — moves a native op to the CPU).
"""

from __future__ import annotations

import re
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import FallbackError, UsageError, format_error, setting

__all__ = ["Policy", "FallbackWarning", "PolicyWarning", "make_policy", "policy_of", "FallbackCounter"]


class FallbackWarning(UserWarning):
    """An op ran on the CPU because the target lacks it (``fallback="warn"``)."""


class PolicyWarning(UserWarning):
    """A policy entry that has no effect, or moves a native op to the CPU."""


@dataclass(frozen=True)
class Policy:
    """The routing part of a session's Config, with op names resolved to overloads."""

    fallback: str = "allow"
    force_cpu: frozenset[str] = frozenset()
    deny: frozenset[str] = frozenset()
    deny_codes: frozenset[str] = frozenset()  # reason codes (TA-F001) whose fallbacks are refused
    allow: frozenset[str] = frozenset()  # ops that fall back silently whatever ``fallback`` says
    allow_codes: frozenset[str] = frozenset()
    max_fallbacks: int | None = None  # distinct ops that may fall back before one more raises

    def allowed(self, decision: Any) -> bool:
        """``configure(allow=...)`` names the op or its reason's code."""
        return decision.op in self.allow or (bool(self.allow_codes) and decision.code in self.allow_codes)

    def denied(self, decision: Any) -> bool:
        """``configure(deny=...)`` names the op or its reason's code."""
        return decision.op in self.deny or (bool(self.deny_codes) and decision.code in self.deny_codes)


CODE = re.compile(r"^TA-[A-Z]\d{3}$")


def _codes(names: Iterable[str], option: str) -> tuple[list[str], frozenset[str]]:
    """Split ``names`` into op names and reason codes; a code must be a CPU-fallback code of the table."""
    from ..core.codes import CODES

    ops, codes = [], set()
    for raw in names:
        if not isinstance(raw, str) or not CODE.match(raw):
            ops.append(raw)
            continue
        code = CODES.get(raw)
        if code is None or code.route != "fallback":
            fallbacks = sorted(c for c, v in CODES.items() if v.route == "fallback")
            raise UsageError(format_error(
                f"torch_adapter.configure({option}=[{raw!r}])", f"op names or CPU-fallback reason codes ({', '.join(fallbacks)})",
                repr(raw) + ("" if code is None else f" (a {code.route} code: {code.title})"),
                why=f"{option} decides whether a CPU fallback may run; only fallback codes name one",
                fix=f"a code from docs/reasons.md's fallback section, e.g. configure({option}=['TA-F001'])"))
        codes.add(raw)
    return ops, frozenset(codes)


def _expand(names: Iterable[str], option: str, known: frozenset[str]) -> dict[str, frozenset[str]]:
    """``{name as given: op overloads it names}``; a packet name ("aten::mm") names all overloads."""
    from .names import candidates, op_name
    from .profiles import match_ops

    out: dict[str, frozenset[str]] = {}
    for raw in names:
        if not isinstance(raw, str):
            raise UsageError(format_error(
                f"torch_adapter.configure({option}=...)", 'op names such as "aten::nonzero"',
                f"{raw!r} ({type(raw).__name__})", fix=f'e.g. configure({option}=["aten::nonzero"])'))
        (name,) = candidates(raw)
        found = match_ops([name], known)[name]
        if not found:
            op_name(raw, call=f"torch_adapter.configure({option}=[{raw!r}])")  # raises, with suggestions
        out[raw] = frozenset(found)
    return out


def _warn(message: str) -> None:
    from .log import user_site

    site = user_site() or {"file": "<torch_adapter>", "line": 0}
    warnings.warn_explicit(message, PolicyWarning, site["file"], site["line"])


def make_policy(config: Any, profile: Any) -> Policy:
    """Check ``config``'s routing options against ``profile`` and resolve op names."""
    from . import rules
    from .choose import decide_name
    from .names import known_op_names

    deny_ops, deny_codes = _codes(config.deny, "deny")
    allow_ops, allow_codes = _codes(getattr(config, "allow", ()), "allow")
    known = known_op_names() if (config.force_cpu or deny_ops or allow_ops) else frozenset()  # not read otherwise
    force = _expand(config.force_cpu, "force_cpu", known)
    deny = _expand(deny_ops, "deny", known)
    allow = _expand(allow_ops, "allow", known)
    both = sorted(set().union(*deny.values(), deny_codes) & set().union(*allow.values(), allow_codes))
    if both:
        raise UsageError(format_error(
            "torch_adapter.configure(deny=..., allow=...)", "each op or code in one of them", ", ".join(both),
            why="an op cannot be refused and allowed at once", fix=f"remove {both[0]!r} from one of the two"))
    for raw, ops in force.items():
        if any(n in rules.ENGINE_OPS or decide_name(n, profile).via in ("view", "metadata") for n in ops):
            raise UsageError(format_error(
                f"torch_adapter.configure(force_cpu=[{raw!r}])", "ops that compute (not views, metadata or copies)",
                repr(raw), why="a view or copy op moved to the CPU could no longer alias the target's tensor",
                fix=f"remove {raw!r} from force_cpu"))
        if any(profile.is_native(n) for n in ops):
            cost = "changes nothing but the path" if profile.dispatch_key == "CPU" else "adds copies each call"
            _warn(f"configure(force_cpu=[{raw!r}]): {raw} has a native {profile.dispatch_key} kernel on "
                  f"{profile.name}; forcing it to the CPU {cost}")
    for raw, ops in deny.items():
        routes = {n: decide_name(n, profile) for n in ops}
        if all(d.route.value != "fallback" for d in routes.values()):
            reason = next(iter(routes.values())).reason
            _warn(f"configure(deny=[{raw!r}]): {raw} never runs on the CPU on {profile.name} ({reason}); "
                  f"deny has no effect there")
    return Policy(config.fallback, frozenset().union(*force.values()), frozenset().union(*deny.values()),
                  deny_codes, frozenset().union(*allow.values()), allow_codes, getattr(config, "max_fallbacks", None))


def policy_of(session: Any) -> Policy | None:
    """The Policy the session's engine enforces, or None when no engine is attached."""
    handle = getattr(session, "routing", None)
    return getattr(handle, "policy", None)


class FallbackCounter:
    """Per-op fallback counts of one session; raises or warns as the policy says."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def check(self, policy: Policy, decision: Any) -> None:
        """Called before an op runs on the CPU: raise under "error"/deny."""
        op = decision.op
        if policy.allowed(decision):
            return
        budget = policy.max_fallbacks
        if budget is not None and op not in self.calls:
            with self._lock:
                fell = sorted(o for o, n in self.calls.items() if n)
            if len(fell) >= budget:
                from ..core.callsite import user_site

                site = user_site(call=True)
                listed = ", ".join(fell[:10]) + (f" and {len(fell) - 10} more" if len(fell) > 10 else "")
                raise FallbackError(format_error(
                    f"{op} on {self.target}{_called_from(site)}", f"at most {budget} distinct ops on the CPU "
                    "(configure(max_fallbacks=...))",
                    f"one more: {op} ({decision.code}: {decision.reason})" + (f"; already: {listed}" if fell else ""),
                    why="the session's fallback budget is spent",
                    fix=(f"raise the budget (configure(max_fallbacks={budget + 1})), allow this one "
                         f"(configure(allow=[{op!r}]) or its code {decision.code!r}), or give it an implementation: "
                         f"@torch_adapter.register_fallback({op!r})")))
        denied = policy.denied(decision)
        if denied or policy.fallback == "error":
            from ..core.callsite import running_as, user_site

            site = user_site(call=True)
            where = running_as()
            named = op if op in policy.deny else decision.code
            why = (f"{'it' if named == op else f'its reason code {named}'} is in configure(deny=...)" if denied
                   else 'the fallback policy is "error"')
            call = f"`{site['call']}`" if site and site.get("call") else "this call"
            if denied:
                ways = f"remove {named!r} from deny (`torch_adapter.configure(deny=[...])`) to let {call} run it on the CPU"
            else:
                ways = (f"to let {call} run {op} on the CPU, {setting('fallback', 'warn', where)} (it warns at the "
                        f"1st, 2nd, 4th ... call; `allow`: silently)")
            ways += f"; to keep it on the target, give it an implementation: @torch_adapter.register_fallback({op!r})"
            raise FallbackError(format_error(
                f"{op} on {self.target}{_called_from(site)}", "an op the target runs natively or by decomposition",
                f"a CPU fallback ({decision.code}: {decision.reason}; docs/reasons.md#{decision.code.lower()})",
                why=why, fix=ways))

    def count(self, policy: Policy, decision: Any, nbytes: int) -> None:
        """Count one CPU call of ``decision.op``; warn at the 1st, 2nd, 4th, 8th ... call."""
        op = decision.op
        with self._lock:
            n = self.calls.get(op, 0) + 1
            self.calls[op] = n
            total = self.bytes.get(op, 0) + nbytes
            self.bytes[op] = total
        if policy.fallback == "warn" and n & (n - 1) == 0 and not policy.allowed(decision):
            from ..core.callsite import running_as, user_site
            from .wording import format_bytes

            site = user_site(call=True) or {"file": "<torch>", "line": 0, "function": ""}
            warnings.warn_explicit(
                f"{op}{_called_from(site, at=False)} ran on the CPU on {self.target}: call {n} of this op so far, "
                f"{format_bytes(total)} copied ({decision.code}: {decision.reason}). Next warning at call {2 * n}. "
                f"Fix: register an implementation with torch_adapter.register_fallback({op!r}), "
                f"or silence with {setting('fallback', 'allow', running_as())}.",
                FallbackWarning, site["file"], site["line"])


def _called_from(site: dict[str, Any] | None, at: bool = True) -> str:
    """``", from `torch.pdist(emb)` at cell [7], line 2"`` (``at=False``: ``" (from `torch.pdist(emb)`)"``):
    the user's call that reached the op."""
    from ..core.callsite import site_text

    if not site:
        return ""
    call = f" `{site['call']}`" if site.get("call") else ""
    if not at:
        return f" (from{call})" if call else ""
    return f", from{call} at {site_text(site)}"
