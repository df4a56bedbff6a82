"""Op coverage by model family × target: ``torch-adapter coverage`` and :func:`measure`.

For each model family (built-in or ``module:factory``) and target, one training step
(forward, backward, optimizer step) is traced, and the share of op calls and of distinct
ops that would run natively, as composites, or as CPU fallbacks is reported, with the
top fallback ops and why. Coverage is where ops would run on the target, not its speed:
simulated targets execute on this machine.

>>> from torch_adapter import coverage
>>> report = coverage.measure(models=["resnet", "bert"], targets=["cuda", "mps"])
>>> print(coverage.render_text(report))

Importing this package is light: torch, diffusers and transformers load when measuring.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["measure", "CoverageReport", "CoverageRow", "FallbackOp", "Family", "FAMILIES", "DEMO_OP",
           "render_text", "render_json", "render_markdown", "render_html", "SCHEMA", "VERSION", "SCOPE"]

_LAZY = {
    "measure": "engine", "CoverageReport": "data", "CoverageRow": "data", "FallbackOp": "data",
    "SCHEMA": "data", "VERSION": "data", "SCOPE": "data", "Family": "models", "FAMILIES": "models",
    "DEMO_OP": "models", "render_text": "render", "render_json": "render", "render_markdown": "render",
    "render_html": "html_page",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'torch_adapter.coverage' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
