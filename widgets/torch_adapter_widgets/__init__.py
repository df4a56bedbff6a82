"""Jupyter widgets for torch_adapter (ipywidgets + plotly). Filled in by the Jupyter issue."""

from torch_adapter._version import __version__

__all__ = ["__version__"]
