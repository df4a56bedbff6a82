"""Tutorial 02's throughput comparison, run several times: what the chart's verdicts say run after run.

Executes ``notebooks/02_port_stable_diffusion.ipynb`` through nbclient (a real kernel), from its first
cell to the cell reading ``%%adapter_compare``'s result (``compare-read``), then its clean-up; each run
in a fresh kernel and a fresh temporary folder. Prints each run's verdict per configuration and writes
them, with the CPU flags and load, as JSON:

    python benchmarks/tutorial_compare.py --runs 3      # benchmarks/results/tutorial_compare.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402

NOTEBOOK = ROOT / "notebooks" / "02_port_stable_diffusion.ipynb"


def _cells_to_compare(nb: Any) -> Any:
    ids = [c.get("id") for c in nb.cells]
    last = ids.index("compare-read")
    cleanup = [c for c in nb.cells if c.cell_type == "code" and "shutil.rmtree(WORK)" in "".join(c.source)]
    nb.cells = nb.cells[:last + 1] + cleanup
    return nb


def once() -> dict[str, Any]:
    import nbformat
    from nbclient import NotebookClient

    nb = _cells_to_compare(nbformat.read(NOTEBOOK, as_version=4))
    work = tempfile.mkdtemp(prefix="tutorial-compare-")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_ADAPTER_AUTOINSTALL",)}
    env.update(TMPDIR=work, PYTHONUNBUFFERED="1")
    t = time.perf_counter()
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": work}}).execute(env=env)
    took = time.perf_counter() - t
    (read,) = [c for c in nb.cells if c.get("id") == "compare-read"]
    text = "".join(o.get("text", "") for o in read.outputs if o.output_type == "stream")
    (compare,) = [c for c in nb.cells if c.get("id") == "compare"]
    table = "".join(o.get("data", {}).get("text/plain", "") for o in compare.outputs if o.output_type == "display_data")
    return {"seconds": round(took, 1), "verdicts": text.strip().splitlines(), "table": table.strip().splitlines()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    runs = []
    start = harness.conditions()
    for i in range(args.runs):
        run = once()
        runs.append(run)
        print(f"run {i + 1}/{args.runs} ({run['seconds']} s):")
        print("\n".join("  " + line for line in run["verdicts"]), flush=True)
    data = {"name": "tutorial_compare", "notebook": NOTEBOOK.name, "conditions_start": start,
            "conditions_end": harness.conditions(own=1.0), "runs": runs}
    harness.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = harness.RESULTS_DIR / "tutorial_compare.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
