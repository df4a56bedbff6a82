"""Where the adapted float16 path's time goes, op by op, against plain float32 (torch.profiler).

One program of ``lowp_programs.py`` under one CPU kind (``bench_lowp.KINDS``: native or emulated),
plain (the program's float32 path, plain CPU torch) and adapted (its float16 path under
``torch-adapter run``), each in fresh interpreters pinned to one CPU, interleaved for ``--rounds``
rounds; every sample profiles ``--calls`` program calls with torch.profiler after its timed ones. Per
aten op: self CPU microseconds per program call (median over the rounds) in both, and the
difference; the differences summed by group:

- ``rewritten``: the ops the float16 rewrite sits on (``routing.low_precision.OPS``). Their self time
  holds the gate's work (the casts in and out, the caches) and, for ops with no child kernel (``mm``,
  ``addmm``, ...), the kernel itself — the same float32 kernel on a kind that computes float16 in
  float32, a faster bfloat16 one where it has bf16 units;
- ``casts``: ``aten::to``/``_to_copy``/``copy_`` (the program's own, and ours where the C++ gate is not built);
- ``other``: the rest — mostly the program's elementwise ops and norms, float16 adapted, float32 plain.

The profiler's own cost per op is in both columns alike; totals are larger than unprofiled ones.

    python benchmarks/lowp_attribution.py --kind avx2 --program class_images --rounds 3
    python benchmarks/lowp_attribution.py --kind native --program unet --figures   # docs/figures/
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import bench_lowp, harness  # noqa: E402

CASTS = ("aten::to", "aten::_to_copy", "aten::copy_")


def attribute(samples: dict[str, list[dict]], rewritten: set[str]) -> dict:
    """Median self time per op and config, the differences, and their sums by group."""
    ops = sorted({op for runs in samples.values() for run in runs for op in run["ops"]})
    per_op = {}
    for op in ops:
        row = {c: statistics.median(run["ops"].get(op, [0.0, 0.0])[0] for run in runs) for c, runs in samples.items()}
        row["calls"] = statistics.median(run["ops"].get(op, [0.0, 0.0])[1] for run in samples["adapted"])
        row["difference"] = row["adapted"] - row["plain"]
        per_op[op] = row

    def group(op: str) -> str:
        return "rewritten" if op in rewritten else "casts" if op in CASTS else "other"

    groups: dict[str, dict[str, float]] = {}
    for op, row in per_op.items():
        g = groups.setdefault(group(op), {"plain": 0.0, "adapted": 0.0, "difference": 0.0})
        for k in g:
            g[k] += row[k]
    total = {k: sum(g[k] for g in groups.values()) for k in ("plain", "adapted", "difference")}
    for g in groups.values():
        g["share_of_difference"] = g["difference"] / total["difference"] if total["difference"] else 0.0
    return {"per_op_us": per_op, "groups_us": groups, "total_us": total,
            "wall_ms": {c: statistics.median(statistics.median(r["ms"]) for r in runs) for c, runs in samples.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", default="native", choices=sorted(bench_lowp.KINDS))
    p.add_argument("--program", default="class_images", help="as bench_lowp's --programs: NAME[:wide][@PIXELS]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="timed calls per sample before the profiled ones")
    p.add_argument("--calls", type=int, default=3, help="profiled calls per sample")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pin", type=int, default=harness.default_pin())
    p.add_argument("--top", type=int, default=15, help="ops printed, by the size of their difference")
    p.add_argument("--figures", action="store_true", help="write docs/figures/ (else benchmarks/results/)")
    args = p.parse_args(argv)
    from torch_adapter.core.cpu_features import cpu_features
    from torch_adapter.routing.low_precision import OPS

    missing = [f for f in bench_lowp.KINDS[args.kind][1] if f not in cpu_features().flags]
    if missing:
        p.error(f"--kind {args.kind} needs a CPU with {', '.join(missing)} to emulate it; this one lacks them")
    result = {"name": "lowp_attribution", "kind": args.kind, "program": args.program, "rounds": args.rounds,
              "calls": args.calls, "conditions_start": harness.conditions(args.threads),
              "pinned_cpu": args.pin if args.pin >= 0 else None}
    samples: dict[str, list[dict]] = {"plain": [], "adapted": []}
    with tempfile.TemporaryDirectory() as folder:
        bench_lowp.build_pipelines([args.program], folder, args.threads)
        for r in range(args.rounds):
            for config in (("plain", "adapted") if r % 2 == 0 else ("adapted", "plain")):
                samples[config].append(bench_lowp.run_program(config, args.program, args.kind, args, folder,
                                                                   ("--profile", str(args.calls))))
            print(f"  round {r + 1}: " + ", ".join(
                f"{c} {statistics.median(s[-1]['ms']):.0f} ms" for c, s in samples.items()), flush=True)
    result.update(attribute(samples, set(OPS)))
    result["conditions_end"] = harness.conditions(args.threads, own=args.threads)
    result["loaded"] = result["conditions_start"]["loaded"] or result["conditions_end"]["loaded"]

    wall, total = result["wall_ms"], result["total_us"]
    print(f"{args.program} on {args.kind}: wall {wall['plain']:.0f} vs {wall['adapted']:.0f} ms "
          f"(adapted {wall['plain'] / wall['adapted']:.2f}x of plain); profiled self time "
          f"{total['plain'] / 1e3:.1f} vs {total['adapted'] / 1e3:.1f} ms, difference {total['difference'] / 1e3:+.1f} ms")
    for name, g in sorted(result["groups_us"].items()):
        print(f"  {name:10s} plain {g['plain'] / 1e3:7.1f} ms  adapted {g['adapted'] / 1e3:7.1f} ms  "
              f"{g['difference'] / 1e3:+6.1f} ms ({g['share_of_difference']:.0%} of the difference)")
    rows = sorted(result["per_op_us"].items(), key=lambda kv: -abs(kv[1]["difference"]))[:args.top]
    for op, row in rows:
        print(f"  {op[:52]:52s} {row['plain']:9.0f} {row['adapted']:9.0f} us  {row['difference']:+8.0f}  "
              f"({row['calls']:.0f} calls)")
    out_dir = harness.FIGURES_DIR if args.figures else harness.RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"lowp_attribution_{args.kind}_{args.program.replace(':', '_').replace('@', '_')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}{' (LOADED: load from other work above 0.5 per core)' if result['loaded'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
