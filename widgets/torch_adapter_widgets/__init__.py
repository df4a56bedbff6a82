"""Jupyter views for torch_adapter: charts as plotly figures that last (their JSON mime bundle plus a
static PNG in the same output's html, :mod:`._static`; no widget state), live controls as ipywidgets.

- :class:`RoutingInspector` — live per-cell routing: stacked bars of op calls per cell by route
  (an output of its own, updated once per cell, never per op), and a widget with the totals, a
  sortable, filterable op table and the selected op's reason and call sites. Closed (or the
  extension unloaded), the widget's output says so instead of leaving a widget view behind.
- :class:`ThroughputComparison` — throughput kept per configuration as a measurement (median, 95 %
  interval, verdict): plotly's JSON mime bundle, a static image and an HTML table in one output.
"""

from torch_adapter._version import __version__

from .compare import ThroughputComparison
from .inspector import RoutingInspector

__all__ = ["__version__", "RoutingInspector", "ThroughputComparison"]
