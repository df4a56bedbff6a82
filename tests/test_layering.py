"""The import graph: the current session lives at the bottom (torch_adapter.core.state); nothing
below torch_adapter.session imports it, so there is no loop through the session."""

from __future__ import annotations

import ast
from pathlib import Path

import torch_adapter

PACKAGE = Path(torch_adapter.__file__).parent
# The entry points above the session: they install, switch and uninstall sessions.
ABOVE = {"session", "launch.runner", "cli.main", "cli.export", "cli.memory", "launch.autoinstall", "__init__", "__main__",
         "jupyter.magics", "jupyter.compare", "jupyter.extension"}


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return ".".join(rel.parts)


def _imports(path: Path) -> set[str]:
    """Every torch_adapter module ``path`` imports, at module level or inside functions."""
    mod = _module(path)
    package = mod.split(".")[:-1] if path.name != "__init__.py" else mod.split(".")
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            elif (node.module or "").startswith("torch_adapter"):
                target = node.module.removeprefix("torch_adapter").strip(".")
            else:
                continue
            out.add(target)
            out.update(f"{target}.{a.name}".strip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("torch_adapter").strip(".") for a in node.names
                       if a.name.startswith("torch_adapter"))
    return out


GRAPH = {_module(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def test_only_the_entry_points_import_the_session():
    importers = sorted(m for m, deps in GRAPH.items() if "session" in deps and m not in ABOVE)
    assert importers == [], f"modules below session.py import it: {importers}"


def test_the_state_module_imports_nothing_of_the_package():
    assert GRAPH["_state"] == set()


def test_no_import_loop_through_the_session():
    """Nothing the session reaches by imports reaches the session back."""
    seen, todo = set(), [d for d in GRAPH["session"] if d in GRAPH]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        assert "session" not in GRAPH[mod] or mod in ABOVE, f"{mod} (reached from session) imports session"
        todo.extend(d for d in GRAPH[mod] if d in GRAPH and d not in ABOVE)
    assert "redirect.log" in seen and "routing.engine" in seen  # the scan really follows the imports
