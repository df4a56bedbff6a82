"""What `%%adapter_compare` says, run after run: its verdicts on the same cells, repeated.

In one real ipykernel (jupyter_client), `%load_ext torch_adapter`, then each cell is compared
``--times`` times (default 3) with ``%%adapter_compare --configs redirect,adapted,npu-sim``:

- ``sd_unet``: the tiny SD1.5 UNet training step (benchmarks/workloads.py), tutorial 02's cell;
- ``op_bound``: 20 iterations of ``(q @ q).tanh()`` on a 64x64 tensor, the cell where runs of a
  few hundred microseconds meet a configuration switch between runs.

Each repetition's rows (median, quartiles, throughput kept with its 95 % interval, verdict,
stalls) go to the JSON with the CPU's flags. A comparison is trustworthy when its verdicts agree
with each other: a resolved verdict that flips between repetitions is a defect of the measurement.

    python benchmarks/bench_compare.py            # writes docs/figures/compare_verdicts.json
    python benchmarks/bench_compare.py --times 5 --configs redirect,adapted
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from benchmarks.bench_jupyter import _execute  # noqa: E402

CELLS = {
    "sd_unet": ("from benchmarks.workloads import get\nstep = get('sd_unet').build('cuda')\nstep(); step()",
                "step()"),
    "op_bound": ("import torch\nq = torch.randn(64, 64, device='cuda')",
                 "for _ in range(20):\n    q = (q @ q).tanh()"),
}
KEYS = ("n", "median_s", "q1_s", "q3_s", "kept", "kept_low", "kept_high", "verdict", "outliers", "error")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--times", type=int, default=3, help="repetitions of each comparison (default 3)")
    ap.add_argument("--configs", default="redirect,adapted,npu-sim")
    ap.add_argument("--cells", default=",".join(CELLS), help=f"which cells: {', '.join(CELLS)}")
    ap.add_argument("-n", type=int, default=5, help="the magic's -n")
    ap.add_argument("--min-time", type=float, default=1.0, help="the magic's --min-time")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "compare_verdicts.json"),
                    help="where the JSON goes (default: %(default)s; the committed figure: "
                         "docs/figures/compare_verdicts.json)")
    args = ap.parse_args(argv)

    from jupyter_client.manager import start_new_kernel

    runs: dict[str, list[dict]] = {}
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        _execute(kc, f"import sys; sys.path.insert(0, {str(ROOT)!r})")
        _execute(kc, "%load_ext torch_adapter")
        for name in args.cells.split(","):
            setup, body = CELLS[name]
            _execute(kc, setup)
            for _ in range(args.times):
                _execute(kc, f"%%adapter_compare --configs {args.configs} -n {args.n} --min-time {args.min_time}\n{body}")
                _, out, _ = _execute(kc, "import json\nprint(json.dumps({k: {kk: v[kk] for kk in "
                                         f"{KEYS!r}}} for k, v in _adapter_compare.items()}}))")
                rows = json.loads("".join(o.get("text", "") for o in out if "text" in o).strip().splitlines()[-1])
                runs.setdefault(name, []).append(rows)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    for name, reps in runs.items():
        print(f"== {name}")
        for i, rows in enumerate(reps, 1):
            parts = []
            for cfg, r in rows.items():
                if r["error"]:
                    parts.append(f"{cfg}: could not run")
                    continue
                stalls = f", {len(r['outliers'])} stalls" if r["outliers"] else ""
                parts.append(f"{cfg} {r['median_s'] * 1e3:.3g} ms x{r['n']}: {r['kept'] * 100:.0f} % "
                             f"({r['kept_low'] * 100:.0f}-{r['kept_high'] * 100:.0f}) {r['verdict']}{stalls}")
            print(f"  run {i}: " + " | ".join(parts))
    harness.write_meta_json(Path(args.json).stem, {"command": "python benchmarks/bench_compare.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "configs": args.configs, "runs": runs}, Path(args.json).parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
