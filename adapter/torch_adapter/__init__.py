"""torch_adapter: run CUDA-written PyTorch code unchanged on any accelerator, and see
how every aten op was routed (native, composite or CPU fallback).

``import torch_adapter`` does nothing by itself: no patch, no device probe, no kernel
registration, and no IPython/ipywidgets/plotly import. Call :func:`install` (or use
``with adapted():``, ``torch-adapter run``, or ``%load_ext torch_adapter``).

Public names are loaded on first use (PEP 562), so importing the package stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__

__all__ = [
    "__version__",
    "install",
    "uninstall",
    "adapted",
    "configure",
    "current",
    "trace",
    "Route",
    "RouteDecision",
    "RoutingLog",
    "targets",
    "describe",
    "explain",
    "register_fallback",
    "register_accelerated",
    "optimize",
    "profiler",
    "debug",
    "export",
    "memory",
    "coverage",
    "prepare",
    "redirect_log",
    "errors",
    "load_ipython_extension",
    "unload_ipython_extension",
]

# public name -> (module, attribute or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "install": ("session", "install"),
    "uninstall": ("session", "uninstall"),
    "adapted": ("session", "adapted"),
    "configure": ("session", "configure"),
    "current": ("session", "current"),
    "targets": ("routing.target", "targets"),
    "describe": ("routing.target", "describe"),
    "redirect_log": ("redirect.log", "redirect_log"),
    "errors": ("errors", None),
    "trace": ("routing.trace", "trace"),
    "Route": ("routing.decide", "Route"),
    "RouteDecision": ("routing.decide", "RouteDecision"),
    "RoutingLog": ("routing.log", "RoutingLog"),
    "explain": ("routing.explain", "explain"),
    "register_fallback": ("routing.registry", "register_fallback"),
    "register_accelerated": ("routing.registry", "register_accelerated"),
    "optimize": ("routing.optimize", None),
    "profiler": ("tools.profiler", None),
    "debug": ("tools.debug", None),
    "export": ("tools.exporting", "export"),
    "memory": ("tools.memory", None),
    "coverage": ("coverage", None),
    "prepare": ("optimization.prepare", "prepare"),
    "load_ipython_extension": ("jupyter.extension", "load_ipython_extension"),
    "unload_ipython_extension": ("jupyter.extension", "unload_ipython_extension"),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'torch_adapter' has no attribute {name!r}") from None
    module = importlib.import_module(f"{__name__}.{module_name}")
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the built extension (``jupyter labextension develop .``)."""
    return [{"src": "labextension", "dest": "torch-adapter-labextension"}]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
