"""What the kernel adds after each notebook cell for issue 23 (points 2-4), side by side.

Two per-cell costs, each timed interleaved (A B A B ...) against what ran before:

1. **ordering the cell's op table** — ``RoutingLog.table()`` in tree order (each child under
   its parent, :meth:`RoutingLog.tree`) against the flat sort it replaced, on the log of one
   training step of a small model on simulated MPS (recorder mode: every op with its parent);
2. **telling the front end the kernel's state** — ``CellRouter.status_if_changed()``, run at
   the end of every cell (builds the status, compares it with the last one sent), against a
   cell end without it, measured as the absolute microseconds it adds.

The ratios are printed and written to ``benchmarks/results/cell_state.json`` with the CPU
flags, thread count and load average (a figure taken with load > 0.5 per core is marked
loaded).

    python benchmarks/bench_cell_state.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import write_meta_json  # noqa: E402


def _flat(log):  # the order RoutingLog.records() had before the tree
    order = {"refused": 0, "fallback": 1, "composite": 2, "yours": 3, "native": 4}
    return [r.as_dict() for r in sorted(log.entries.values(),
                                        key=lambda r: (order[r.route], -r.calls, r.op, r.parent or ""))]


def _interleave(a, b, rounds: int, inner: int) -> tuple[list[float], list[float]]:
    ta, tb = [], []
    for _ in range(rounds):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            out.append((time.perf_counter() - t0) / inner)
    return ta, tb


def main() -> int:
    import torch

    import torch_adapter
    from torch_adapter.jupyter.extension import CellRouter

    load_start = os.getloadavg()[0]
    torch_adapter.install("mps", simulate=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                                torch.nn.Linear(128, 10)).cuda()
    x = torch.randn(32, 64, device="cuda")
    with torch_adapter.trace(use_observer=False) as log:
        torch.nn.functional.cross_entropy(model(x), torch.zeros(32, dtype=torch.long, device="cuda")).backward()
    flat, tree = _interleave(lambda: _flat(log), log.table, rounds=15, inner=200)

    class Shell:  # CellRouter only needs events for register(); status needs the session
        events = None

    router = CellRouter(Shell())
    router.publish_comm = False  # no kernel here: the comparison is what is measured
    router.status_if_changed()
    nothing, status = _interleave(lambda: None, router.status_if_changed, rounds=15, inner=200)
    load_end = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    loaded = max(load_start, load_end) > 0.5 * cores
    result = {
        "entries": len(log.entries),
        "table_flat_us": round(statistics.median(flat) * 1e6, 2),
        "table_tree_us": round(statistics.median(tree) * 1e6, 2),
        "tree_over_flat": round(statistics.median(tree) / statistics.median(flat), 3),
        "status_if_changed_us": round((statistics.median(status) - statistics.median(nothing)) * 1e6, 2),
        "cpu_flags": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
        "load_average": [round(load_start, 2), round(load_end, 2)], "cores": cores,
        "loaded": loaded,
    }
    print(f"op table of one step ({result['entries']} entries): flat sort {result['table_flat_us']} µs, "
          f"tree {result['table_tree_us']} µs (×{result['tree_over_flat']}); status_if_changed "
          f"{result['status_if_changed_us']} µs per cell; {result['cpu_flags']}, {result['threads']} threads, "
          f"load {result['load_average']} on {cores} cores{' (LOADED)' if loaded else ''}")
    write_meta_json("cell_state", result)
    torch_adapter.uninstall()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
