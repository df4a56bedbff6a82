"""The adapter never starts OpenMP's thread team in the program's process (core/threads.py).

GNU libgomp is not fork-safe: once a parallel region ran on more than one thread, a forked process
hangs in its first parallel region. On a first run (empty start-up cache) ``install()`` measures the
CPU's bfloat16 speed (where the flags choose bfloat16) and a simulated target probes decompositions;
run on the program's threads, that work started the team, and accelerate's ``notebook_launcher``
ranks forked after ``%load_ext torch_adapter`` hung for good. Each case runs in a fresh interpreter with
an empty cache, checks that installing created no thread, then forks a child that runs parallel
kernels on two threads and must finish.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import multiprocessing as mp, os, sys, torch
    torch.set_num_threads(2)
    import torch_adapter

    def threads():
        return len(os.listdir("/proc/self/task"))

    def work(q):
        x = torch.randn(1024, 1024)
        q.put(float((x @ x).log_softmax(-1).sum()))     # parallel regions on 2 threads

    before = threads()
    torch_adapter.install(sys.argv[1], simulate=sys.argv[2] == "1")
    print("threads before", before, "after install", threads(), flush=True)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=work, args=(q,))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        sys.exit("the forked child hung")
    print("child exit", child.exitcode, "result", q.get(timeout=5), flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task; fork start method")
@pytest.mark.parametrize("target,simulate", [("cpu", "0"), ("mps", "1"), ("npu", "1")],
                         ids=["cpu (the speed check)", "mps simulated (probes)", "npu simulated"])
def test_installing_on_a_first_run_leaves_the_process_fork_safe(tmp_path, target, simulate):
    env = {**os.environ, "TORCH_ADAPTER_CACHE_DIR": str(tmp_path / "cache")}  # empty: a first run
    res = subprocess.run([sys.executable, "-c", SCRIPT, target, simulate], capture_output=True, text=True,
                         timeout=240, env=env)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    before, after = map(int, re.search(r"threads before (\d+) after install (\d+)", res.stdout).groups())
    assert after == before, res.stdout  # no OpenMP worker started by the adapter's own work
    assert re.search(r"child exit 0 result -?\d", res.stdout), res.stdout
