"""The package's layers, proven from its real import graph.

Every import is read from the source (ast): top-level and function-local, ``from . import x``,
and the package ``__init__`` modules each import runs first (importing ``a.b.c`` executes
``a/__init__`` and ``a/b/__init__``), plus the names a package ``__init__`` loads lazily through
its ``_LAZY`` table (PEP 562). On that graph: no import cycle at all, every edge points down the
layer order below (or stays inside its part), and the few rules the design rests on hold.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import torch_adapter

PACKAGE = Path(torch_adapter.__file__).parent
ROOT = "torch_adapter"

# Lowest first. A module may import its own part and any part of a lower layer; parts of one
# layer are independent of each other.
LAYERS: list[set[str]] = [
    {"errors", "_version"},
    {"core"},  # state, patching, the import hook, config, private torch APIs, safe writer, call sites
    {"emulated"},  # the emulated accelerator: a PrivateUse1 device built by the project (a target's device)
    {"redirect", "routing"},  # the two mechanisms: entry-point patches; op routes and their execution
    {"optimization", "tools"},  # what optimization_level does; debug/memory/profiler/export
    {"session"},  # install/uninstall/adapted/configure: puts the layers below together
    {"launch"},  # `run`, launchers, child processes
    {"check", "coverage"},  # the static checker and the op-coverage matrix
    {"jupyter"},  # the notebook front end (`%adapter check` runs the checker)
    {"cli"},  # the command line (check and coverage add their sub-commands by name)
    {"__init__", "__main__"},  # the public face (every name lazy) and `python -m torch_adapter`
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    name = ".".join(rel.parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The package module ``name`` (or an attribute of it) lives in; None outside the package."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _with_parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _lazy(package: str) -> dict[str, str]:
    """A package's names loaded on first use (its ``_LAZY`` table: name -> module)."""
    if package not in MODULES or MODULES[package].name != "__init__.py":
        return {}
    table = getattr(importlib.import_module(package), "_LAZY", {})
    return {k: f"{package}.{v[0] if isinstance(v, tuple) else v}" for k, v in table.items()}


def _imports(name: str, path: Path) -> set[str]:
    """What importing (and running) ``name`` imports: its import statements, the packages they go
    through, and the lazy names it takes from a package (``from torch_adapter import install``,
    ``torch_adapter.install(...)`` after ``import torch_adapter``)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            lazy = _lazy(base)
            found.update(lazy.get(a.name, f"{base}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    for node in ast.walk(tree):  # `import torch_adapter` ... torch_adapter.install(...)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in found:
            found.add(_lazy(node.value.id).get(node.attr, ""))
    out: set[str] = set()
    for target in found:
        resolved = _resolve(target) if target.split(".")[0] == ROOT else None
        if resolved is not None:
            out |= _with_parents(resolved)
    out.discard(name)
    return {m for m in out if m in MODULES}


def _lazy_edges() -> dict[str, set[str]]:
    """Each package's lazy names, as the edges of the package's public face."""
    return {name: set(_lazy(name).values()) for name in MODULES}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_for_real():
    """The scan sees function-local imports, relative imports, the packages they go through and the
    lazy names taken from a package."""
    assert "torch_adapter.redirect.install" in GRAPH["torch_adapter.session"]  # function-local, relative
    assert "torch_adapter.redirect" in GRAPH["torch_adapter.session"]  # the package __init__ runs first
    assert "torch_adapter.session" in GRAPH["torch_adapter.coverage.engine"]  # torch_adapter.current()
    assert _lazy_edges()["torch_adapter"] >= {"torch_adapter.session", "torch_adapter.routing.explain"}


def test_every_lazy_name_points_down():
    """A package's public face loads only modules of its own part (the root: any part)."""
    for package, targets in _lazy_edges().items():
        assert all(t in MODULES for t in targets), (package, targets)
        if package != ROOT:
            assert {_part(t) for t in targets} <= {_part(package)}, (package, targets)


def test_no_import_cycle():
    assert _cycles() == []


def test_every_part_has_a_layer():
    assert {_part(m) for m in MODULES} <= set(RANK), "a new part of the package needs a place in LAYERS"


def test_imports_point_down_only():
    # (every module goes through the root package, whose import runs only _version: proven below)
    wrong = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps
                   if d != ROOT and _part(d) != _part(m) and RANK[_part(d)] >= RANK[_part(m)])
    assert wrong == [], "imports that point up or sideways:\n" + "\n".join(wrong)


def test_the_root_holds_the_public_face_only():
    flat = sorted(m for m, p in MODULES.items() if m.count(".") == 1 and p.name != "__init__.py")
    assert len(flat) <= 12, flat
    # importing the package runs nothing but the version (every public name is lazy)
    assert GRAPH[ROOT] == {f"{ROOT}._version"}
    eager = [n for n in ast.parse((PACKAGE / "__init__.py").read_text()).body
             if isinstance(n, ast.Import) or (isinstance(n, ast.ImportFrom) and n.module != "__future__")]
    assert [ast.unparse(n) for n in eager] == ["import importlib", "from typing import Any",
                                               "from ._version import __version__"]


def test_the_state_module_imports_nothing_of_the_package():
    assert GRAPH["torch_adapter.core.state"] == set()


@pytest.mark.parametrize("module", ["torch_adapter.routing.decide", "torch_adapter.routing.names"])
def test_the_decision_reads_no_session_and_runs_no_probe(module):
    """decide() is a pure function of its arguments: nothing it imports reads the session, runs the
    self-decomposition probe or executes ops."""
    reach, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in reach:
            reach.add(m)
            todo.extend(GRAPH[m])
    for impure in ("torch_adapter.core.state", "torch_adapter.routing.self_decomp", "torch_adapter.routing.engine",
                   "torch_adapter.routing.choose", "torch_adapter.session"):
        assert impure not in reach, f"{module} reaches {impure}"
