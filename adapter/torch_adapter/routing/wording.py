"""How routes and sizes are named, ordered and coloured: one table for every view.

The routing log, the cell payload, ``%%adapter_trace``, ``run --report``, the inspector,
``check`` and the Lab extension (``lab_extension/src/format.ts`` mirrors this table) all
word a route the same way. Plain data and two pure functions; imports nothing.

=========  ============================================================  ===============
route      what ran                                                      the pill says
=========  ============================================================  ===============
native     the target's kernel (or a view, or ``register_accelerated``)  ``native``
composite  the op's definition in other ops, each routed again           ``composite``
yours      your ``register_fallback`` function, on the device: no copy   ``yours``
fallback   the CPU: inputs copied there, results copied back             ``CPU``
refused    nothing: the policy (``error``, ``deny``) raised instead       ``refused``
=========  ============================================================  ===============
"""

from __future__ import annotations

__all__ = ["ROUTES", "SHORT", "LONG", "COLORS", "WORST_FIRST", "format_bytes"]

#: Every route a log counts, in the order the views show them.
ROUTES = ("native", "composite", "yours", "fallback", "refused")

#: The word after a count in a pill or a totals line ("3 CPU").
SHORT = {"native": "native", "composite": "composite", "yours": "yours", "fallback": "CPU", "refused": "refused"}

#: The words in a sentence or a tooltip ("3 CPU fallback op calls").
LONG = {"native": "native", "composite": "composite", "yours": "your implementation",
        "fallback": "CPU fallback", "refused": "refused"}

COLORS = {"native": "#2e7d32", "composite": "#f9a825", "yours": "#1565c0", "fallback": "#c62828",
          "refused": "#6a1b9a"}

#: Tables list what needs a look first.
WORST_FIRST = {"refused": 0, "fallback": 1, "composite": 2, "yours": 3, "native": 4}


def format_bytes(n: float) -> str:
    """Bytes in binary units, as the Lab badge writes them: ``"512 B"``, ``"32.3 KiB"``, ``"1.5 MiB"``."""
    value, unit = float(max(0, n)), 0
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(value)} B"
    return f"{int(value * 10 + 0.5) / 10:.1f} {units[unit]}"  # half up, as JavaScript's toFixed(1)
