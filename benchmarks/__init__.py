"""Throughput benchmarks: plain torch against torch_adapter configurations.

``harness`` is the library (configurations, interleaved runs, tables, JSON);
``workloads`` holds the steps; each ``bench_*.py`` is a script. Run them as
``python benchmarks/bench_redirect.py --quick`` or ``python -m benchmarks.bench_redirect``.
"""
