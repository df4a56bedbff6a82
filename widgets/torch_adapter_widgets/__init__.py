"""Jupyter widgets for torch_adapter (ipywidgets; charts are inline SVG, see ``_svg``).

- :class:`RoutingInspector` — live per-cell routing: stacked bars per cell, a sortable,
  filterable op table, and the selected op's reason and call sites. Updated once per
  cell (never per op).
  Front ends without widgets get its text/html and text/plain renderings.
- :class:`ThroughputComparison` — throughput kept per configuration, with spread.
"""

from torch_adapter._version import __version__

from .compare import ThroughputComparison
from .inspector import RoutingInspector

__all__ = ["__version__", "RoutingInspector", "ThroughputComparison"]
