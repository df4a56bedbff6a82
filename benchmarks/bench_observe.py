"""Plain torch against observation on: what does counting every op cost?

"observe" runs each timed block under :class:`torch_adapter.routing.observe.OpObserver`,
started and stopped inside the timed region (as around a notebook cell: what start() and
stop() cost counts, spread over the block's steps); goal >= 97 % of plain throughput on the
tiny-SD training step (issue 3). "adapted_observe" adds redirection around the block (the
notebook set-up: ``%load_ext torch_adapter`` on a real target, observation per cell);
"observe_python" is the profiler-based fallback, for reference (on request).

The first "observe" block builds the C++ observer if it is not cached (~7 s, untimed).

    python benchmarks/bench_observe.py --quick
    python benchmarks/bench_observe.py --repeats 15 --configs plain,observe,plain_again
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness, workloads  # noqa: E402

__all__ = ["GOAL", "observing", "main"]

GOAL = 0.97


def observing(backend: str = "auto") -> Any:
    """A context factory: an OpObserver running for the block. The last block's result is
    kept on the factory as ``.last``."""

    @contextlib.contextmanager
    def context() -> Iterator[None]:
        from torch_adapter.routing.observe import OpObserver

        obs = OpObserver(backend).start()
        try:
            yield
        finally:
            context.last = obs.stop()  # type: ignore[attr-defined]

    context.last = None  # type: ignore[attr-defined]
    return context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_arguments(parser, workloads=["sd_unet", "cnn"])
    parser.add_argument("--target", default="auto", help="adapter target for adapted_observe (default: auto)")
    args = parser.parse_args(argv)
    chosen = ["sd_unet", "cnn"] if args.workload == "all" else [args.workload]
    observe_cpp = observing("auto")
    plain = harness.plain()
    adapted = harness.adapted(args.target)
    configs = [
        plain,
        harness.Configuration("observe", plain.context, plain.device, "OpObserver() per block", GOAL,
                              timed=observe_cpp),
        harness.Configuration("adapted_observe", adapted.context, "cuda",
                              f"{adapted.description} + OpObserver() per block", GOAL, timed=observing("auto")),
        harness.Configuration("observe_python", plain.context, plain.device,
                              "OpObserver(backend='python') per block (the fallback)", timed=observing("python")),
        harness.plain(name="plain_again"),
    ]
    args.configs = args.configs or "plain,observe,adapted_observe"
    harness.run_from_args(args, [workloads.get(n) for n in chosen], configs, default_name="observe",
                          quick={"repeats": 5, "steps": 2, "warmup": 1, "min_block": 0})
    last = observe_cpp.last
    if last is not None:
        print(f"observer backend {last.backend}: {last.total_calls} op calls in the last observe block "
              f"({len(last.ops())} distinct ops), errors: {last.errors or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
