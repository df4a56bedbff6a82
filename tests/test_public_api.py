"""The public surface is pinned, and importing the package does nothing."""

import json
import subprocess
import sys

import torch_adapter

EXPECTED = {
    "__version__", "install", "uninstall", "adapted", "configure", "current", "trace", "Route", "RoutingLog",
    "RouteDecision", "targets", "describe", "explain", "register_fallback", "register_accelerated",
    "optimize", "profiler", "debug", "export", "memory", "coverage", "prepare", "redirect_log", "errors",
    "load_ipython_extension", "unload_ipython_extension",
}


def test_all_is_pinned():
    assert set(torch_adapter.__all__) == EXPECTED


def test_import_has_no_side_effects():
    code = (
        "import sys, json, torch\n"
        "before = {n: id(getattr(torch.cuda, n)) for n in dir(torch.cuda)}\n"
        "t_before = {n: id(v) for n, v in vars(torch.Tensor).items()}\n"
        "import torch_adapter\n"
        "after = {n: id(getattr(torch.cuda, n)) for n in dir(torch.cuda)}\n"
        "t_after = {n: id(v) for n, v in vars(torch.Tensor).items()}\n"
        "import torch_adapter.routing.target as t\n"
        "print(json.dumps({'same': before == after and t_before == t_after,\n"
        "  'heavy': [m for m in ('IPython', 'ipywidgets', 'plotly', 'torch_adapter_widgets', 'yaml',\n"
        "           'torch_adapter.redirect', 'torch_adapter.routing.engine') if m in sys.modules],\n"
        "  'probed': t._detect_one.cache_info().currsize}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "heavy": [], "probed": 0}


def test_unknown_attribute_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        torch_adapter.nope  # noqa: B018
