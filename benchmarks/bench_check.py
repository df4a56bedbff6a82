"""How fast is `torch-adapter check` on real trees? Scans the installed diffusers and
transformers sources (site-packages; nothing is imported from them) and reports files/s
and findings. Goal (issue 4): >= 300 files/s on 2 cores.

    python benchmarks/bench_check.py                 # 3 repeats, 2 worker processes
    python benchmarks/bench_check.py --jobs 1 --repeats 1
    python benchmarks/bench_check.py --path ./my-project

Prints a table and writes benchmarks/results/check.json (docs/figures/check.json with ``--figures``). The figure is the median over
repeats of (files scanned) / (wall time of scan()), discovery and worker start-up included;
files per CPU-second (this process and its workers) is printed too, as it is what a busy
shared machine cannot disturb.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

GOAL = 300.0  # files per second
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402  (its folders: results unless asked, the figures with --figures)

__all__ = ["GOAL", "package_dir", "bench_tree", "main"]


def package_dir(name: str) -> Path | None:
    """Where an installed package's sources are, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def bench_tree(path: Path, *, jobs: int, repeats: int) -> dict[str, Any]:
    from torch_adapter.check.engine import scan

    times, cpus, report = [], [], None
    for _ in range(repeats):
        c0, t0 = _cpu(), time.perf_counter()
        report = scan(path, jobs=jobs)
        times.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
    assert report is not None
    med = statistics.median(times)
    return {"path": str(path), "files": report.files_scanned, "parsed": report.files_parsed,
            "findings": len(report.findings), "by_severity": report.counts(), "notes": len(report.notes),
            "seconds": [round(t, 3) for t in times], "median_s": round(med, 3),
            "files_per_s": round(report.files_scanned / med, 1),
            "best_files_per_s": round(report.files_scanned / min(times), 1),
            "cpu_s": round(statistics.median(cpus), 3),
            "files_per_cpu_s": round(report.files_scanned / statistics.median(cpus), 1)}


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the scan's workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="append", help="trees to scan (default: installed diffusers, transformers)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="check", help="the file's NAME (default check)")
    parser.add_argument("--figures", action="store_true", help="write docs/figures/NAME.json (the committed figure)")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.path] if args.path else [
        p for p in (package_dir("diffusers"), package_dir("transformers")) if p is not None]
    if not paths:
        print("bench_check: neither diffusers nor transformers is installed; pass --path", file=sys.stderr)
        return 2
    rows = [bench_tree(p, jobs=args.jobs, repeats=args.repeats) for p in paths]
    files = sum(r["files"] for r in rows)
    seconds = sum(r["median_s"] for r in rows)
    cpu = sum(r["cpu_s"] for r in rows)
    total = {"files": files, "findings": sum(r["findings"] for r in rows), "median_s": round(seconds, 3),
             "files_per_s": round(files / seconds, 1) if seconds else 0.0,
             "cpu_s": round(cpu, 3), "files_per_cpu_s": round(files / cpu, 1) if cpu else 0.0}
    total["goal_met"] = total["files_per_s"] >= GOAL
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"torch-adapter check: files/s (jobs={args.jobs}, goal >= {GOAL:g})")
    for col in ("tree", "files", "parsed", "findings", "✅ / ⚠️ / ❌", "notes", "median s", "files/s"):
        table.add_column(col, justify="left" if col == "tree" else "right")
    for r in rows:
        s = r["by_severity"]
        table.add_row(Path(r["path"]).name, str(r["files"]), str(r["parsed"]), str(r["findings"]),
                      f"{s['handled']} / {s['review']} / {s['unsupported']}", str(r["notes"]),
                      f"{r['median_s']:.2f}", f"{r['files_per_s']:.0f}")
    table.add_row("total", str(total["files"]), "", str(total["findings"]), "", "", f"{total['median_s']:.2f}",
                  f"{total['files_per_s']:.0f}", style="bold")
    Console(width=max(110, Console().width)).print(table)
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    result = {"benchmark": "check", "goal_files_per_s": GOAL, "jobs": args.jobs, "repeats": args.repeats,
              "trees": rows, "total": total,
              "meta": {"python": platform.python_version(), "machine": platform.machine(),
                       "cpus": os.cpu_count(), "loadavg": load, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}}
    folder = harness.FIGURES_DIR if args.figures else harness.RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{args.json}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{total['files_per_s']:.0f} files/s ({'meets' if total['goal_met'] else 'below'} the goal of "
          f"{GOAL:g}); {total['files_per_cpu_s']:.0f} files per CPU-second; load average "
          f"{', '.join(f'{x:.1f}' for x in load or [])}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
