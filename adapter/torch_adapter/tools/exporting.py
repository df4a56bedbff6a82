"""``torch_adapter.export(model, example_inputs, target=..., path=...)``: a ``torch.export``
program lowered to what the target runs natively, plus the ops that would still fall back.

::

    result = torch_adapter.export(model, (x,), target="mps", path="model.pt2")
    result.fallbacks          # [{"op": "aten::_linalg_eigh", "nodes": 1, "reason": "..."}]
    result.decomposed         # ["aten::heaviside", ...]: replaced by their decompositions
    program = torch.export.load("model.pt2")   # program.module()(x) == model(x)

How: ``torch.export.export`` traces the model; every op in the graph is routed on the
target (:func:`torch_adapter.explain`, the same decisions the routing engine executes);
``run_decompositions`` is then called with a table holding exactly the ops routed
*composite* — the target lacks them but they decompose (torch.export's default table,
which includes CompositeImplicitAutograd ops and whose pieces are core ATen ops, else the
``torch._decomp`` entry the routing engine runs) — never a decomposition on the
training-unsafe deny-list (those ops route *fallback*). Pieces that
are themselves composite are decomposed in turn, until nothing changes. Native ops are
kept as they are (a target with its own ``aten::linear`` keeps it). What is left that the
target lacks is reported: ``fallbacks`` (would run on the CPU) and ``composite`` (run by
their own composite kernel at run time: no decomposition table entry exists).

A decomposition written with ``prims::*`` ops (PyTorch's reference implementations) is not
used: a target artifact holds core ATen ops only, and the op stays as a leftover. For an
*incomplete* profile (mtia, or a vendor table that could not be read) the report cannot be
trusted: export warns (``incomplete="warn"``, the default) or refuses (``"raise"``).
``leftovers`` lists, per op the target lacks in the final graph, its nodes, route and why.

Tracing and decomposing run under :func:`torch_adapter.routing.internal.internal`: the ops
they run (on fake tensors) are in this report, not in a notebook cell's routing report.

With ``path``, the program is saved with ``torch.export.save`` and the report is written
next to it as JSON (``model.pt2`` -> ``model.routing.json``, schema ``torch-adapter.export``).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError, format_error

__all__ = ["export", "ExportResult", "SCHEMA", "VERSION"]

SCHEMA = "torch-adapter.export"
VERSION = 2  # 2: `routes` counts five routes (yours, refused)
_ROUNDS = 8  # decomposition rounds at most (pieces of pieces); real graphs settle in 1-2


@dataclass
class ExportResult:
    """The lowered program and what the target still lacks in it."""

    program: Any  # torch.export.ExportedProgram
    target: str
    decomposed: list[str] = field(default_factory=list)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    composite: list[dict[str, Any]] = field(default_factory=list)
    routes: dict[str, int] = field(default_factory=dict)  # graph nodes per route
    leftovers: list[dict[str, Any]] = field(default_factory=list)  # per op the target lacks: nodes, route, why
    notes: list[str] = field(default_factory=list)  # e.g. the profile is incomplete
    path: Path | None = None
    report_path: Path | None = None

    def module(self) -> Any:
        """The program as a callable module (``program.module()``)."""
        return self.program.module()

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": VERSION, "target": self.target,
                "path": str(self.path) if self.path else None, "routes": self.routes,
                "decomposed": self.decomposed, "fallbacks": self.fallbacks, "composite": self.composite,
                "leftovers": self.leftovers, "notes": self.notes}

    def __repr__(self) -> str:
        return (f"<ExportResult for {self.target}: {sum(self.routes.values())} op nodes, "
                f"{len(self.decomposed)} ops decomposed, {len(self.fallbacks)} would fall back>")


def _ops(program: Any) -> dict[Any, int]:
    """``{OpOverload: node count}`` of the program's graph."""
    from ..core.torch_private import is_op_overload

    counts: dict[Any, int] = {}
    for node in program.graph.nodes:
        if node.op == "call_function" and is_op_overload(node.target):
            counts[node.target] = counts.get(node.target, 0) + 1
    return counts


def _decomposition(op: Any, decision: Any, defaults: Any) -> Any:
    """The decomposition to lower ``op`` with: torch.export's default (core ATen and
    CompositeImplicitAutograd) table first — its pieces are core ATen ops — else the
    ``torch._decomp`` entry the routing engine itself runs; never a deny-listed one."""
    from ..core import torch_private as tp
    from ..routing.rules import TRAINING_UNSAFE_DECOMPOSITIONS

    name = op.name()
    if name in TRAINING_UNSAFE_DECOMPOSITIONS:
        return None
    if decision.via == "device-selected":  # the host's own kernel: the target runs another op in its place
        return None
    if op in defaults:
        return defaults[op]  # (CustomDecompTable.get does not materialise its lazy entries)
    table = tp.decompositions()
    if decision.via in ("torch._decomp", "CompositeImplicitAutograd") and name in table:
        # a Python decomposition written with other ops; preferred to op.decompose, whose
        # CompositeImplicit py_kernel can re-enter the op under run_decompositions
        # (aten::upsample_nearest2d.vec recursed without end)
        return None if _uses_prims(table[name]) else table[name]
    if decision.via == "CompositeImplicitAutograd":
        return op.decompose
    return None


def _uses_prims(fn: Any) -> bool:
    """A reference implementation (torch._refs / torch._prims): it lowers to prims::* ops."""
    inner = getattr(fn, "__wrapped__", fn)
    module = str(getattr(inner, "__module__", "") or "")
    return module.startswith(("torch._refs", "torch._prims"))


def _profile_note(spec: Any, incomplete: str) -> list[str]:
    """The profile's incompleteness, warned about or refused (``incomplete`` is "warn"/"raise")."""
    import warnings

    from ..routing.explain import profile_of

    profile = profile_of(spec)[0]
    if profile.complete:
        return []
    note = (f"the {profile.name} profile is incomplete ({profile.description or profile.source}): ops it lacks in "
            "this report may have kernels on the real device")
    if incomplete == "raise":
        raise UsageError(format_error(f"torch_adapter.export(..., target={profile.name!r})",
                                      "a complete capability profile", f"{profile.name!r}: {note}",
                                      why="the lowered program would keep ops the target may run natively, or "
                                          "decompose ops it has", fix="pass incomplete='warn' to export anyway, or a "
                                          "complete profile (.toml with the target's native ops)"))
    warnings.warn(f"torch_adapter.export: {note}", UserWarning, stacklevel=3)
    return [note]


def _target_label(target: Any) -> tuple[Any, str]:
    from ..core.state import current

    if target is None:
        session = current()
        if session is not None:
            return None, session.target.name
        from ..routing.target import resolve

        return None, resolve("auto").name
    name = getattr(target, "name", target)
    return target, str(name)


def _check(model: Any, example_inputs: Any, path: Any) -> tuple[Any, Path | None]:
    import torch

    call = "torch_adapter.export(model, example_inputs, ...)"
    if not isinstance(model, torch.nn.Module):
        raise UsageError(format_error(call, "an nn.Module", f"{model!r} ({type(model).__name__})",
                                      why="torch.export traces modules", fix="wrap a function in an nn.Module"))
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise UsageError(format_error(call, "example_inputs as a tuple of the model's positional arguments",
                                      f"{type(example_inputs).__name__}", fix="export(model, (x,), ...)"))
    out = None
    if path is not None:
        out = Path(path)
        if out.suffix != ".pt2":
            raise UsageError(format_error(f"torch_adapter.export(..., path={os.fspath(path)!r})",
                                          "a path ending in .pt2", repr(os.fspath(path)),
                                          why="torch.export.save writes a .pt2 archive",
                                          fix=f"path={str(out.with_suffix('.pt2'))!r}"))
        from ..core.safe_io import check_output  # both files, before anything is exported

        out = check_output(out, call="torch_adapter.export(path=...)")
        check_output(out.with_suffix(".routing.json"), call="torch_adapter.export(path=...): the routing report")
    return tuple(example_inputs), out


def export(model: Any, example_inputs: Any, *, target: Any = None, path: str | os.PathLike[str] | None = None,
           kwargs: dict[str, Any] | None = None, dynamic_shapes: Any = None, strict: bool = False,
           incomplete: str = "warn") -> ExportResult:
    """Export ``model`` lowered to ``target``'s native ops (see the module doc).

    ``target``: a name (``"mps"`` uses the built-in profile unless an MPS device is here), a
    ``.toml`` profile, a Target or a CapabilityProfile; by default the installed target (its
    registrations and policies included), or this machine's. ``kwargs``,
    ``dynamic_shapes`` and ``strict`` are passed to ``torch.export.export``. ``incomplete``:
    ``"warn"`` (default) or ``"raise"`` when the target's profile is incomplete.
    """
    import torch

    from ..routing.explain import explain
    from ..routing.internal import internal

    args, out = _check(model, example_inputs, path)
    if incomplete not in ("warn", "raise"):
        raise UsageError(format_error("torch_adapter.export(..., incomplete=...)", "'warn' or 'raise'",
                                      repr(incomplete), fix="incomplete='raise' refuses incomplete profiles"))
    spec, label = _target_label(target)
    notes = _profile_note(spec, incomplete)
    decisions: dict[str, Any] = {}

    def decide(op: Any) -> Any:
        name = op.name()
        if name not in decisions:
            decisions[name] = explain(name, spec)
        return decisions[name]

    with internal():  # tracing (fake tensors) runs nothing of the user's: no routing report counts it
        program = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    program, tried = _lower(program, decide)
    counts = _ops(program)
    routes, fallbacks, composite, leftovers = _tally(counts, decide)
    result = ExportResult(program, label, sorted(tried - {op.name() for op in counts}), fallbacks, composite, routes,
                          leftovers, notes)
    if out is not None:
        _save(result, program, out)
    return result


def _lower(program: Any, decide: Any) -> tuple[Any, set[str]]:
    """Decompose, round by round, every op the target runs as a composite; the lowered program
    and the names of the ops decomposed."""
    import torch

    from ..routing.decide import Route
    from ..routing.internal import internal

    defaults = torch.export.default_decompositions()
    tried: set[str] = set()
    for _ in range(_ROUNDS):
        table = {}
        for op in _ops(program):
            if op.name() in tried or decide(op).route is not Route.COMPOSITE:
                continue
            fn = _decomposition(op, decide(op), defaults)
            if fn is not None:
                table[op] = fn
                tried.add(op.name())
        if not table:
            break
        with warnings.catch_warnings():
            # torch's own deep copy of its pytree specs warns about its own deprecated LeafSpec
            # (copyreg FutureWarning, once per round): nothing a caller can act on.
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                    category=FutureWarning)
            with internal():
                program = program.run_decompositions(table)
    return program, tried


def _tally(counts: dict[Any, int], decide: Any) -> tuple[dict[str, int], list[dict], list[dict], list[dict]]:
    """The lowered graph's ops by route: counts, fallbacks, composites, and what is left over."""
    from ..routing.decide import Route

    routes = {r.value: 0 for r in Route}
    fallbacks, composite, leftovers = [], [], []
    for op, n in sorted(counts.items(), key=lambda kv: kv[0].name()):
        if op.namespace == "prims":  # never chosen above; if torch's own table made one, say so
            leftovers.append({"op": op.name(), "nodes": n, "route": "fallback", "graph_op": op.name(),
                              "reason": "a prims::* op (not core ATen) left by a decomposition"})
            routes[Route.FALLBACK.value] += n
            continue
        d = decide(op)
        routes[d.route.value] += n
        row = {"op": d.op, "nodes": n, "reason": d.reason, "via": d.via}
        if d.route in (Route.FALLBACK, Route.REFUSED):
            fallbacks.append(row)
        elif d.route is Route.COMPOSITE:
            composite.append(row)
        if d.route is not Route.NATIVE:
            why = {Route.COMPOSITE: "kept in the graph: no decomposition into core ATen ops (without prims::*) is available",
                   Route.YOURS: "kept in the graph: your register_fallback implementation is eager Python, not in the graph",
                   }.get(d.route, "would run on the CPU")
            leftovers.append({"op": d.op, "nodes": n, "route": d.route.value, "graph_op": op.name(),
                              "reason": f"{why}: {d.reason}"})
    return routes, fallbacks, composite, leftovers


def _save(result: ExportResult, program: Any, out: Any) -> None:
    """The program and its routing report, with the one safe writer (atomic; the folder must exist)."""
    import torch

    from ..core.safe_io import atomic_writer, write_text

    with atomic_writer(out, call="torch_adapter.export(path=...)") as fh:
        torch.export.save(program, fh)
    result.path = out
    result.report_path = out.with_suffix(".routing.json")
    write_text(result.report_path, json.dumps(result.to_dict(), indent=1) + "\n",
               call="torch_adapter.export(path=...): the routing report")
