"""Eager against compiled, as ``torch_adapter.prepare(model)`` applies ``optimization_level``.

Each configuration installs the adapter on the CPU target with one optimization level and
builds the tiny-SD training step (the ``sd_unet`` workload of ``workloads.py``) through
``torch_adapter.prepare(model)``: ``conservative`` keeps it eager, ``balanced`` is
``torch.compile(model)``, ``aggressive`` ``torch.compile(model, mode="max-autotune")``
(``max-autotune-no-cudagraphs`` off CUDA). Steps are then timed interleaved by the harness.

Compile time is reported apart from step time: the first step after building (which
compiles the forward and backward graphs) minus a steady step. It depends on inductor's
cache: on this machine a development measurement (docs/figures/README.md#compile) found ~110 s cold and 7–9 s warm for the
tiny-SD step, for a 1.06–1.11× faster step. ``--cold`` points inductor at an empty cache
folder to measure a first compile. Not run in CI (minutes).

    python benchmarks/bench_compile.py --quick                 # conservative vs aggressive
    python benchmarks/bench_compile.py --configs conservative,balanced,aggressive --cold
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness, workloads  # noqa: E402

__all__ = ["main", "COMPILE_S"]

LEVELS = ("conservative", "balanced", "aggressive")
COMPILE_S: dict[str, float] = {}  # level -> seconds the first step spent compiling


def _build_prepared(device: str = "cuda", *, batch: int = 2, sample_size: int = 32) -> Callable[[], None]:
    """workloads.sd_unet's step (same model, optimizer and inputs), its model passed through
    torch_adapter.prepare(); times the first step apart."""
    import torch_adapter

    level = torch_adapter.current().config.optimization_level
    step = workloads._build_sd_unet(device, batch=batch, sample_size=sample_size, wrap=torch_adapter.prepare)
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    step()
    COMPILE_S[level] = max(first - (time.perf_counter() - t0), 0.0)
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_arguments(parser, workloads=["sd_unet"])
    parser.add_argument("--cold", action="store_true", help="compile with an empty inductor cache (a first compile)")
    args = parser.parse_args(argv)
    if args.cold:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_compile_inductor_")
    workload = workloads.Workload("sd_unet", _build_prepared, workloads.sd_unet.description + ", via prepare()")
    configs = [harness.adapted("cpu", name=level, optimization_level=level) for level in LEVELS]
    args.configs = args.configs or "conservative,aggressive"
    results = harness.run_from_args(args, [workload], configs, default_name="compile",
                                    quick={"repeats": 5, "steps": 3, "warmup": 1, "min_block": 0.5})
    cache = "empty (--cold)" if args.cold else "as found (warm if compiled before)"
    for result in results:
        result.meta.update(compile_s=dict(COMPILE_S), inductor_cache=cache)
        folder = harness.json_folder(args.json) if args.json else None
        harness.write_json(result, folder)  # again, now with the compile times
        base = result.configs[0]
        for cfg in result.configs:
            print(f"{cfg.name:>12}: {cfg.median_s * 1e3:8.1f} ms/step, {base.median_s / cfg.median_s:.3f}x vs "
                  f"{base.name}; first-step compile {COMPILE_S.get(cfg.name, 0.0):7.1f} s; build {cfg.build_s:7.1f} s")
    print(f"inductor cache: {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
