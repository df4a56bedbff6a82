"""Jupyter views for torch_adapter (the inspector: ipywidgets with inline-SVG charts, ``_svg``; the
comparison: a plotly chart with its numbers, no widget state).

- :class:`RoutingInspector` — live per-cell routing: stacked bars per cell, a sortable,
  filterable op table, and the selected op's reason and call sites. Updated once per
  cell (never per op).
  Front ends without widgets get its text/html and text/plain renderings.
- :class:`ThroughputComparison` — throughput kept per configuration as a measurement (median, 95 %
  interval, verdict): plotly's JSON mime bundle, a static image and an HTML table in one output.
"""

from torch_adapter._version import __version__

from .compare import ThroughputComparison
from .inspector import RoutingInspector

__all__ = ["__version__", "RoutingInspector", "ThroughputComparison"]
