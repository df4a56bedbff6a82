"""Plain torch against redirect-only torch_adapter: what does redirection cost?

Redirect-only mode patches entry points (``.cuda()``, ``device="cuda"``, ``torch.cuda.*``),
not every op, so a training step should keep >= 99.5 % of plain throughput (issue 2).
The workload is written for CUDA; plain runs it on this machine's real device, adapted
runs it with ``device="cuda"`` redirected to the target (see ``workloads.py``).

    python benchmarks/bench_redirect.py --quick              # < 2 min
    python benchmarks/bench_redirect.py --workload all --repeats 9 --json redirect
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
    args = parser.parse_args(argv)
    chosen = ["sd_unet", "cnn"] if args.workload == "all" else [args.workload]
    configs = [harness.plain(), harness.adapted(args.target, goal=GOAL),
               harness.plain(name="plain_again")]  # A/A noise control, on request
    args.configs = args.configs or "plain,adapted"
    harness.run_from_args(args, [workloads.get(n) for n in chosen], configs, default_name="redirect",
                          quick={"repeats": 5, "steps": 2, "warmup": 1, "min_block": 0})
    return 0


if __name__ == "__main__":
    sys.exit(main())
