"""The coverage report as data: :class:`CoverageReport` with one :class:`CoverageRow` per
model family × target. Renderers (:mod:`.render`, :mod:`.html`) are pure functions of it.

What is counted (the same words are in every output, :data:`COUNTING`): the op calls of
one training step as the dispatcher sees them below autograd — forward, backward and the
optimizer step — each call **once**, at the top level. When the target runs an op as a
composite, the pieces that op is made of are not counted again (they are listed as
``nested_calls``); fallbacks among those pieces still appear in ``top_fallbacks`` with the
op they were part of. Distinct ops: each op counted once, under the least native route any
of its top-level calls took (fallback over composite over native).

Fallback ops are listed in two groups: ``top_fallbacks`` (called by the program, at the top
level: ``explain(op, target)`` says ``fallback`` for each) and ``nested_fallbacks`` (pieces of
a composite op that ran on the CPU — a decomposition that led back to its own op, or a piece
the target lacks; ``inside`` names the composite ops). Ops that exist only because the host
picked its own implementation inside a composite op (oneDNN LSTM, the CPU's attention and
convolution kernels) carry a ``host_selected`` note (:data:`HOST_SELECTED`). On simulated
targets they no longer occur: such a call is routed as the target's own member of its
family (routing/kernel_families.py); the note remains for profiles with the CPU's key.

JSON schema ``torch-adapter.coverage`` version 1 (docs/coverage.md)::

    {"schema": "torch-adapter.coverage", "version": 1, "scope": "...", "counting": "...",
     "torch": "2.13.0+cpu", "targets": ["cuda", "mps"], "models": ["resnet", ...],
     "rows": [{"model": "resnet", "kind": "CNN", "description": "...",
               "target": "mps", "target_spec": "mps", "simulated": true, "profile": "...",
               "calls": {"native": 300, "composite": 10, "fallback": 0, "total": 310},
               "calls_pct": {"native": 96.77, "composite": 3.23, "fallback": 0.0},
               "ops": {"native": 40, "composite": 5, "fallback": 0, "total": 45},
               "ops_pct": {"native": 88.89, "composite": 11.11, "fallback": 0.0},
               "nested_calls": {"native": 0, "composite": 0, "fallback": 0},
               "top_fallbacks": [{"op": "aten::x", "calls": 2, "reason": "...", "inside": [],
                                  "host_selected": ""}],
               "nested_fallbacks": [{"op": "aten::sum.dim_IntList", "calls": 31, "reason": "...",
                                     "inside": ["aten::sum.dim_IntList"], "host_selected": ""}],
               "error": null,
               "dtypes": {"judged": true, "note": "",   # simulated targets: calls the real one refuses
                          "findings": [{"op": "aten::empty.memory_format", "dtype": "float64", "calls": 1,
                                        "message": "...", "site": {...}}]}}],
     "meta": {"duration_s": 12.3}}

Keys may be added within version 1; none is removed or renamed without a new version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ROUTES", "SCHEMA", "VERSION", "SCOPE", "COUNTING", "HOST_SELECTED", "FallbackOp", "CoverageRow",
           "CoverageReport", "percentages", "host_selected"]

ROUTES = ("native", "composite", "fallback")
SCHEMA = "torch-adapter.coverage"
VERSION = 1
SCOPE = ("Coverage says where the ops of one training step would run on each target: natively, as a "
         "composite of other ops, or as a CPU fallback. It is not the target's speed: simulated targets "
         "execute every op on this machine, and their routes come from the target's op table.")
COUNTING = ("Shares are over the op calls of one training step (forward, backward, optimizer step) as the "
            "dispatcher sees them below autograd, each call counted once at the top level (pieces of "
            "composite ops are not counted again); distinct ops take the least native route any of their "
            "calls took.")


# The host-selected kernel table lives with the routing rules (one table, routed native there);
# coverage keeps the note on rows for reports read by older readers of the schema.
from ..routing.rules import HOST_SELECTED, host_selected  # noqa: E402


def percentages(counts: dict[str, int]) -> dict[str, float]:
    """Each route's share of the total in percent (two decimals); zeros when empty."""
    total = sum(counts.get(r, 0) for r in ROUTES)
    return {r: round(100.0 * counts.get(r, 0) / total, 2) if total else 0.0 for r in ROUTES}


@dataclass(frozen=True)
class FallbackOp:
    """An op that ran (or would run) on the CPU: its calls, why, and the composite ops it was a
    piece of (empty when the program called it directly)."""

    op: str
    calls: int
    reason: str
    inside: tuple[str, ...] = ()
    host_selected: str = ""  # a HOST_SELECTED note, when the host picked this kernel

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "calls": self.calls, "reason": self.reason, "inside": list(self.inside),
                "host_selected": self.host_selected}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FallbackOp":
        return cls(data["op"], int(data["calls"]), data.get("reason", ""), tuple(data.get("inside") or ()),
                   data.get("host_selected", ""))


def _counts(data: dict[str, Any] | None) -> dict[str, int]:
    return {r: int((data or {}).get(r, 0)) for r in ROUTES}


@dataclass(frozen=True)
class CoverageRow:
    """One model family on one target."""

    model: str
    kind: str
    description: str
    target: str  # what is shown: "mps", "host (cpu)", a profile's name
    target_spec: str  # what explain(op, target=...) takes: "mps", "cpu", a .toml path
    simulated: bool
    profile: str = ""  # where the target's capabilities come from
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROUTES, 0))
    ops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROUTES, 0))
    nested_calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROUTES, 0))
    top_fallbacks: tuple[FallbackOp, ...] = ()
    nested_fallbacks: tuple[FallbackOp, ...] = ()
    error: str | None = None
    # dtype findings (their own kind, never a route): {"judged", "note", "findings"}; {} on real targets
    dtypes: dict[str, Any] = field(default_factory=dict)

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def calls_pct(self) -> dict[str, float]:
        return percentages(self.calls)

    @property
    def ops_pct(self) -> dict[str, float]:
        return percentages(self.ops)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "kind": self.kind, "description": self.description, "target": self.target,
                "target_spec": self.target_spec, "simulated": self.simulated, "profile": self.profile,
                "calls": {**self.calls, "total": self.total_calls}, "calls_pct": self.calls_pct,
                "ops": {**self.ops, "total": self.total_ops}, "ops_pct": self.ops_pct,
                "nested_calls": dict(self.nested_calls),
                "top_fallbacks": [f.to_dict() for f in self.top_fallbacks],
                "nested_fallbacks": [f.to_dict() for f in self.nested_fallbacks], "error": self.error,
                **({"dtypes": self.dtypes} if self.dtypes else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CoverageRow":
        return cls(model=data["model"], kind=data.get("kind", ""), description=data.get("description", ""),
                   target=data["target"], target_spec=data.get("target_spec", data["target"]),
                   simulated=bool(data.get("simulated")), profile=data.get("profile", ""),
                   calls=_counts(data.get("calls")), ops=_counts(data.get("ops")),
                   nested_calls=_counts(data.get("nested_calls")),
                   top_fallbacks=tuple(FallbackOp.from_dict(f) for f in data.get("top_fallbacks") or ()),
                   nested_fallbacks=tuple(FallbackOp.from_dict(f) for f in data.get("nested_fallbacks") or ()),
                   error=data.get("error"), dtypes=dict(data.get("dtypes") or {}))


@dataclass(frozen=True)
class CoverageReport:
    """Rows in model-major order (every target of the first model, then the next model)."""

    rows: tuple[CoverageRow, ...]
    targets: tuple[str, ...]
    models: tuple[str, ...]
    torch_version: str = ""
    scope: str = SCOPE
    counting: str = COUNTING
    meta: dict[str, Any] = field(default_factory=dict)

    def row(self, model: str, target: str) -> CoverageRow:
        """The row of ``model`` on ``target`` (the displayed target name); KeyError if none."""
        for r in self.rows:
            if r.model == model and r.target == target:
                return r
        raise KeyError(f"no row for model {model!r} on target {target!r}")

    @property
    def errors(self) -> list[CoverageRow]:
        return [r for r in self.rows if r.error]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": VERSION, "scope": self.scope, "counting": self.counting,
                "torch": self.torch_version, "targets": list(self.targets), "models": list(self.models),
                "rows": [r.to_dict() for r in self.rows], "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CoverageReport":
        from ..errors import UsageError, format_error

        if data.get("schema") != SCHEMA or data.get("version") != VERSION:
            raise UsageError(format_error(
                "CoverageReport.from_dict()", f"schema {SCHEMA!r} version {VERSION}",
                f"schema {data.get('schema')!r} version {data.get('version')!r}",
                why="only this version's layout can be read back",
                fix="pass the output of CoverageReport.to_dict() or `torch-adapter coverage --json`"))
        return cls(rows=tuple(CoverageRow.from_dict(r) for r in data.get("rows", [])),
                   targets=tuple(data.get("targets", [])), models=tuple(data.get("models", [])),
                   torch_version=data.get("torch", ""), scope=data.get("scope", SCOPE),
                   counting=data.get("counting", COUNTING), meta=dict(data.get("meta") or {}))
