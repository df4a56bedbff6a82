#!/usr/bin/env bash
# Regenerates every benchmark figure the docs quote, into docs/figures/ (committed).
# About 25 minutes on an idle 2-core machine; run it on a quiet machine (nothing else timed
# or compiling): the tables print the load average at start and end, and an A/A control
# (plain_again) shows what noise alone does to a ratio. The OpInfo sweep is apart
# (docs/figures/README.md: pytest -m full_sweep).
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/bench_optimize.py --json optimize
python benchmarks/bench_optimize.py --top-ops --steps 3 --json optimize
python benchmarks/bench_optimize.py --quick --configs plain,redirect,balanced,aggressive,balanced_untried,aggressive_untried --json optimize_levels
TORCH_ADAPTER_CPU_FEATURES=avx512_bf16 python benchmarks/bench_optimize.py --quick --configs plain,balanced,balanced_untried --json optimize_levels_forced_avx512_bf16
TORCH_ADAPTER_CPU_FEATURES=amx python benchmarks/bench_optimize.py --quick --configs plain,balanced,aggressive,balanced_untried --json optimize_levels_forced_amx
python benchmarks/bench_flight_recorder.py --rounds 5 --json flight_recorder
python benchmarks/bench_optimize.py --configs plain,bf16_autocast,sdpa_math --drift-steps 2 --json optimize_levers
python benchmarks/bench_redirect.py --workload all --repeats 9 --configs plain,adapted,plain_again --json redirect
python benchmarks/bench_redirect.py --workload all --attribute --json redirect
python benchmarks/bench_observe.py --repeats 15 --configs plain,observe,plain_again --json observe
python benchmarks/bench_simulate.py --threads 1 --repeats 9 --json simulate
python benchmarks/bench_compile.py --quick --json compile
python benchmarks/bench_check.py --figures
python benchmarks/bench_attention_dtype.py --figures
