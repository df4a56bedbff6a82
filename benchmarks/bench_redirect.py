"""Plain torch against redirect-only torch_adapter: what does redirection cost?

Redirect-only mode patches entry points (``.cuda()``, ``device="cuda"``, ``torch.cuda.*``),
not every op, so a training step should keep >= 99.5 % of plain throughput (issue 2).
The workload is written for CUDA; plain runs it on this machine's real device, adapted
runs it with ``device="cuda"`` redirected to the target (see ``workloads.py``).

    python benchmarks/bench_redirect.py --quick              # < 2 min
    python benchmarks/bench_redirect.py --workload all --repeats 9 --json redirect
    python benchmarks/bench_redirect.py --attribute          # where the per-step cost goes

``--attribute`` answers what a wall-clock ratio cannot resolve on a noisy machine (the A/A
control ``--configs plain,adapted,plain_again`` shows the noise): it runs the adapted step
under cProfile and adds up the time spent in torch_adapter's own Python frames, plus the
Python built-ins they call directly (not the torch functions they hand on to), per step — the redirection's own work — with the functions that
cost most. cProfile slows every Python call alike, so the share is an estimate of the
fraction of the step the adapter takes; kept = 1 - share.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness, workloads  # noqa: E402

__all__ = ["GOAL", "main"]

GOAL = 0.995


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_arguments(parser, workloads=["sd_unet", "cnn"])
    parser.add_argument("--target", default="auto", help="adapter target (default: auto, the best present)")
    parser.add_argument("--attribute", action="store_true",
                        help="profile the adapted step: the adapter's own time per step and where it goes")
    args = parser.parse_args(argv)
    chosen = ["sd_unet", "cnn"] if args.workload == "all" else [args.workload]
    if args.attribute:
        for name in chosen:
            row = attribute(workloads.get(name), args.target, steps=args.steps)
            print(f"{name}: {row['step_ms']:.1f} ms/step profiled, of which torch_adapter "
                  f"{row['adapter_ms']:.3f} ms ({row['share'] * 100:.3f} %): kept ~{(1 - row['share']) * 100:.2f} % "
                  f"(goal {GOAL * 100:.1f} %)")
            for fn in row["top"]:
                print(f"    {fn['ms_per_step']:8.3f} ms  {fn['calls_per_step']:7.1f} calls  {fn['function']}")
            if args.json:
                harness.write_meta_json(f"{Path(args.json).stem}_{name}_attribution", row,
                                        harness.json_folder(args.json))
        return 0
    configs = [harness.plain(), harness.adapted(args.target, goal=GOAL),
               harness.plain(name="plain_again")]  # A/A noise control, on request
    args.configs = args.configs or "plain,adapted"
    harness.run_from_args(args, [workloads.get(n) for n in chosen], configs, default_name="redirect",
                          quick={"repeats": 5, "steps": 2, "warmup": 1, "min_block": 0})
    return 0


def attribute(workload: object, target: str = "auto", *, steps: int = 5, warmup: int = 3) -> dict[str, object]:
    """The adapted step under cProfile: per step, the time in torch_adapter's own frames (and the
    built-ins they call directly), against the whole profiled step."""
    import cProfile
    import pstats
    import time

    import torch_adapter

    package = str(Path(torch_adapter.__file__).resolve().parent)

    def ours(func: tuple) -> bool:
        return str(Path(func[0]).resolve()).startswith(package) if func[0] not in ("~", "") else False

    with torch_adapter.adapted(target=target):
        step = workload.build("cuda")
        for _ in range(warmup):
            step()
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        for _ in range(steps):
            step()
        profiler.disable()
        wall = time.perf_counter() - t0
    stats = pstats.Stats(profiler).stats  # {func: (cc, nc, tt, ct, callers{func: (cc, nc, tt, ct)})}
    cost: dict[str, list[float]] = {}
    for func, (_cc, nc, tt, _ct, callers) in stats.items():
        if ours(func):
            spent, calls = tt, nc
        else:  # a built-in our frames called directly (isinstance, dict.get, ...); not torch's own
            if func[0] != "~" or "torch" in func[2] or "Tensor" in func[2]:  # the originals: the user's work
                continue
            spent = sum(c[2] for f, c in callers.items() if ours(f))
            calls = sum(c[1] for f, c in callers.items() if ours(f))
        if spent:
            name = f"{Path(func[0]).name}:{func[1]}({func[2]})" if func[0] != "~" else func[2]
            cost.setdefault(name, [0.0, 0.0])
            cost[name][0] += spent
            cost[name][1] += calls
    adapter_s = sum(v[0] for v in cost.values())
    top = sorted(cost.items(), key=lambda kv: -kv[1][0])[:8]
    return {"workload": getattr(workload, "name", str(workload)), "steps": steps, "step_ms": wall / steps * 1e3,
            "adapter_ms": adapter_s / steps * 1e3, "share": adapter_s / wall,
            "top": [{"function": k, "ms_per_step": v[0] / steps * 1e3, "calls_per_step": v[1] / steps} for k, v in top]}


if __name__ == "__main__":
    sys.exit(main())
