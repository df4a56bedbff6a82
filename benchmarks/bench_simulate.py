"""Plain torch against a simulated target: what does executing another backend's routes cost?

``install(target="mps", simulate=True)`` makes every op MPS lacks really run its route on
this machine: its decomposition (each piece routed again) or the CPU fallback with the
copies made and counted. Native ops never leave C++ (see docs/routing.md), so a training
step should keep >= 85 % of plain throughput (issue 3). The workload is written for CUDA;
plain runs it on this machine's real device, the simulated configuration with ``"cuda"``
redirected to the host.

    python benchmarks/bench_simulate.py --quick              # < 2 min
    python benchmarks/bench_simulate.py --repeats 9 --json simulate
    python benchmarks/bench_simulate.py --configs plain,simulated,dispatch_mode   # with the reference
    python benchmarks/bench_simulate.py --configs simulated_dtypes_off,simulated  # the dtype check's cost
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness, workloads  # noqa: E402

__all__ = ["GOAL", "main"]

GOAL = 0.85


def _passthrough_mode() -> harness.Configuration:
    """Reference: a TorchDispatchMode that only forwards each op — what every op would pay
    if enforcement used a mode instead of per-op kernels (docs/routing.md)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Forward(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    plain = harness.plain()
    return harness.Configuration("dispatch_mode", Forward, plain.device, "a pass-through TorchDispatchMode")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_arguments(parser, workloads=["sd_unet", "cnn"])
    parser.add_argument("--simulate", default="mps", help="the simulated target (default: mps)")
    args = parser.parse_args(argv)
    chosen = ["sd_unet", "cnn"] if args.workload == "all" else [args.workload]
    configs = [harness.plain(),
               harness.adapted(args.simulate, simulate=True, name="simulated", goal=GOAL),
               # the dtype check's cost: the same simulated target with dtype_check="off" (docs/routing.md)
               harness.adapted(args.simulate, simulate=True, name="simulated_dtypes_off", dtype_check="off"),
               harness.adapted("cpu", name="redirect_only"),  # the redirect layer alone, for reference
               _passthrough_mode(),  # what a dispatch mode costs before doing any work, for reference
               harness.plain(name="plain_again")]  # A/A noise control, on request
    args.configs = args.configs or "plain,simulated"
    harness.run_from_args(args, [workloads.get(n) for n in chosen], configs, default_name="simulate",
                          quick={"repeats": 5, "steps": 3, "warmup": 2, "min_block": 0.5})
    return 0


if __name__ == "__main__":
    sys.exit(main())
