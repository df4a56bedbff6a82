"""``torch-adapter check``: which lines of a project are CUDA-specific, what the adapter
does with each on a target (✅ handled / ⚠️ needs review / ❌ will not run), what to use
instead -- statically, and at run time joined with how the ops were routed.

Layout (mechanism apart from data)::

    rules.py, rules_ecosystem.py   the rule table (data)
    ruleset.py                     rule validation, user TOML rules, the lookup index
    discover.py                    walking trees and reading files robustly
    pyscan.py / textscan.py        matching Python (AST) / other files (lines)
    notebook.py                    .ipynb cells, magics, line mapping
    rewrite.py                     suggested rewrites as diffs
    engine.py                      scan(): files in, Report out (worker processes)
    runtime.py                     --run: the routing log joined into the report
    model.py                       the Report dataclasses (JSON schema v1)
    json_report.py, html_report.py, render_terminal.py   pure renderings of a Report
    cli.py                         the command line

Importing this package loads nothing heavy; names below are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["scan", "Report", "Finding", "Note", "build_ruleset", "load_rule_file", "join_runtime",
           "load_routing_log", "render_html", "render_json", "summary_renderables"]

_LAZY = {
    "scan": "engine", "Report": "model", "Finding": "model", "Note": "model",
    "build_ruleset": "ruleset", "load_rule_file": "ruleset", "join_runtime": "runtime",
    "load_routing_log": "runtime", "render_html": "html_report", "render_json": "json_report",
    "summary_renderables": "render_terminal",
}


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'torch_adapter.check' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
