"""OpObserver: exact counts, composite parents with their pieces, backward, threads,
start/stop hygiene — on both backends (C++ RecordFunction callback, profiler fallback).

The C++ backend compiles on first use (~7 s, cached in the torch extensions folder); it is
skipped with a reason on a machine without a compiler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch

from torch_adapter.errors import UsageError
from torch_adapter.routing import observe
from torch_adapter.routing.observe import OpObserver, is_op_key

from _observers import backend, needs_cpp, observed  # noqa: F401 - backend is a fixture


def test_counts_a_known_sequence_exactly(backend):
    a, b = torch.ones(3), torch.ones(3)

    def work():
        for _ in range(37):
            torch.add(a, b)
        for _ in range(5):
            torch.mul(a, b)
        a.sin()

    result = observed(backend, work)
    assert result.calls == {"aten::add.Tensor": 37, "aten::mul.Tensor": 5, "aten::sin": 1}
    assert result.top_level == result.calls
    assert result.children == {}
    assert set(result.self_time_ns) == set(result.calls)
    assert all(v > 0 for v in result.self_time_ns.values())
    assert sum(result.self_time_ns.values()) <= result.wall_ns  # self times never overlap
    assert result.total_calls == 43 and result.ops() == result.calls


def test_composite_ops_appear_with_their_pieces(backend):
    x, m = torch.randn(3, 4), torch.randn(4, 5)
    q = torch.randn(1, 2, 4, 8)
    linear = torch.nn.Linear(4, 5)

    def work():
        linear(x)
        torch.einsum("ij,jk->ik", x, m)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)

    result = observed(backend, work)
    assert result.top_level == {"aten::linear": 1, "aten::einsum": 1, "aten::scaled_dot_product_attention": 1}
    assert result.children["aten::linear"] == {"aten::t": 1, "aten::addmm": 1}
    assert result.children["aten::einsum"]["aten::bmm"] == 1
    assert result.children["aten::scaled_dot_product_attention"] == {
        "aten::_scaled_dot_product_flash_attention_for_cpu": 1}
    # nested calls count in `calls` too: aten::t itself called aten::transpose.int
    assert result.calls["aten::addmm"] == 1 and result.children["aten::t"] == {"aten::transpose.int": 1}


def test_backward_ops_are_observed(backend):
    linear = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    loss = linear(x).sum()
    result = observed(backend, loss.backward)
    node = "autograd::engine::evaluate_function: AddmmBackward0"
    assert result.top_level[node] == 1
    assert result.children[node]["aten::mm"] == 1  # the weight gradient
    assert not is_op_key(node) and is_op_key("aten::mm") and is_op_key("aten::add.Tensor")
    assert linear.weight.grad is not None


def test_ops_on_other_threads_are_counted(backend):
    def worker():
        a = torch.ones(2)
        for _ in range(20):
            torch.mul(a, a)

    def work():
        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    result = observed(backend, work)
    assert result.calls["aten::mul.Tensor"] == 60


def test_observers_nest(backend):
    a = torch.ones(2)
    outer = OpObserver(backend).start()
    torch.add(a, a)
    inner = OpObserver(backend).start()
    torch.add(a, a)
    torch.sub(a, a)
    inner_result = inner.stop()
    torch.sub(a, a)
    outer_result = outer.stop()
    assert inner_result.calls == {"aten::add.Tensor": 1, "aten::sub.Tensor": 1}
    assert outer_result.calls == {"aten::add.Tensor": 2, "aten::sub.Tensor": 2}


@needs_cpp
def test_start_stop_leaves_no_callback():
    ext = observe._load()
    before = ext.has_global_callbacks()
    obs = OpObserver("cpp").start()
    assert observe._registered() and ext.has_global_callbacks()
    second = OpObserver("cpp").start()
    obs.stop()
    assert observe._registered()  # still one observer running
    second.stop()
    assert not observe._registered()
    assert ext.has_global_callbacks() == before
    # nothing counted after stop reaches a later observer
    torch.add(torch.ones(1), 1)
    assert OpObserver("cpp").start().stop().calls == {}


_TIMED_OP = """
import json, sys, time
import torch
from torch_adapter.routing import observe
from torch_adapter.routing.observe import OpObserver

lib = torch.library.Library("ta_obs_clock", "DEF")
lib.define("nap(Tensor x) -> Tensor")
lib.impl("nap", lambda x: (time.sleep(0.03), x.clone())[1], "CompositeExplicitAutograd")
x = torch.ones(2)
obs = OpObserver("cpp").start()
t0 = time.perf_counter_ns()
torch.ops.ta_obs_clock.nap(x)
wall = time.perf_counter_ns() - t0
result = obs.stop()
print(json.dumps({"clock": observe._load().clock(), "self": result.self_time_ns["ta_obs_clock::nap"],
                  "clone": result.calls.get("aten::clone", 0), "wall": wall}))
"""


@needs_cpp
@pytest.mark.parametrize("clock", ["default", "steady"])
def test_self_times_are_nanoseconds_on_either_clock(clock):
    """The hot path reads the TSC where it is invariant and scales ticks to ns at snapshot; with
    ``TORCH_ADAPTER_OBSERVER_CLOCK=steady`` it reads steady_clock. Either way a 30 ms op reports
    its 30 ms (the clock is chosen once per process: one subprocess per clock)."""
    env = dict(os.environ)
    env.pop("TORCH_ADAPTER_OBSERVER_CLOCK", None)
    if clock == "steady":
        env["TORCH_ADAPTER_OBSERVER_CLOCK"] = "steady"
    out = subprocess.run([sys.executable, "-c", _TIMED_OP], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    invariant_tsc = sys.platform == "linux" and os.uname().machine == "x86_64" and \
        "nonstop_tsc" in open("/proc/cpuinfo").read()
    expected = "steady_clock" if clock == "steady" or not invariant_tsc else "tsc"
    assert got["clock"]["chosen"] and got["clock"]["source"] == expected
    if expected == "steady_clock":
        assert got["clock"]["ns_per_tick"] == 1.0
    assert got["clone"] == 1
    assert 30e6 <= got["self"] <= got["wall"]


@needs_cpp
def test_counts_stay_exact_while_other_threads_snapshot_and_tables_grow():
    """The owner thread bumps its counters without a lock; snapshots (other observers starting and
    stopping on another thread) and the growth of its tables (ops never seen before) lose nothing."""
    names = ["sin", "cos", "exp", "log1p", "tanh", "sigmoid", "abs", "neg", "sqrt", "rsqrt", "floor", "ceil",
             "round", "trunc", "frac", "reciprocal", "sign", "expm1", "log2", "log10", "erf", "erfc", "asinh",
             "atan", "sinh", "cosh", "square", "relu", "deg2rad", "rad2deg", "lgamma", "digamma", "i0", "sinc"]
    a = torch.rand(4) + 0.5
    rounds = 60
    stop = threading.Event()
    counts = []

    def snapshotter():
        while not stop.is_set():
            counts.append(OpObserver("cpp").start().stop().total_calls)

    def worker():
        for _ in range(rounds):
            for name in names:
                getattr(torch, name)(a)

    outer = OpObserver("cpp").start()
    side = threading.Thread(target=snapshotter)
    side.start()
    try:
        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop.set()
        side.join()
        result = outer.stop()
    assert len(counts) > 1
    for name in names:
        assert result.top_level[f"aten::{name}"] == 2 * rounds, name


def test_python_backend_leaves_profiler_off():
    OpObserver("python").start().stop()
    assert not torch.autograd.profiler._is_profiler_enabled


def test_both_backends_agree_on_a_training_step():
    if not observe.is_compiled_available():
        pytest.skip("no C++ compiler/ninja: the C++ observer cannot be built")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.LazyLinear(2))
    x = torch.randn(2, 3, 8, 8)
    model(x)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    cpp, py = observed("cpp", step), observed("python", step)
    assert cpp.calls == py.calls
    assert cpp.children == py.children
    assert cpp.top_level == py.top_level


def test_a_failing_backend_never_breaks_user_code():
    # A user's own profiler is running: the profiler backend cannot start. The observer
    # warns, reports the failure in the result, and the user's code runs on.
    with torch.autograd.profiler.profile():
        obs = OpObserver("python")
        with pytest.warns(RuntimeWarning, match="failed"):
            obs.start()
        assert obs.backend == "none"
        y = torch.ones(2) + 1
        result = obs.stop()
    assert y.tolist() == [2.0, 2.0]
    assert result.backend == "none" and result.calls == {}
    assert "failed" in result.errors[0]


def test_misuse_gives_clear_errors():
    with pytest.raises(UsageError, match=r"OpObserver\(backend=...\): expected one of"):
        OpObserver("gpu")
    with pytest.raises(UsageError, match=r"OpObserver.stop\(\): expected a running observer"):
        OpObserver("python").stop()
    obs = OpObserver("python").start()
    try:
        with pytest.raises(UsageError, match="already started"):
            obs.start()
    finally:
        obs.stop()


def test_context_manager_and_json():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a working backend warns about nothing
        with OpObserver() as obs:
            torch.ones(2).neg()
    assert obs.result is not None and obs.result.calls["aten::neg"] == 1
    assert obs.backend in ("cpp", "python")
    assert json.loads(json.dumps(obs.result.as_dict()))["calls"]["aten::neg"] == 1


def test_import_has_no_side_effects_and_cli_status():
    code = ("import torch_adapter.routing.observe as o, sys; "
            "assert o._EXT is None; assert 'torch.utils.cpp_extension' not in sys.modules; "
            "print(o.main(['--status']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "built:" in out.stdout and out.stdout.strip().endswith("0")


@needs_cpp
def test_build_entry_point(capsys):
    assert observe.main(["--build"]) == 0
    assert "C++ observer ready" in capsys.readouterr().out
    assert observe.is_built()


NO_COMPILER = """
import warnings, torch
from torch_adapter.routing import observe
assert not observe.is_compiled_available()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = observe.OpObserver().start()
    torch.ones(2).neg()
    result = first.stop()
    observe.OpObserver().start().stop()
print(result.backend, result.calls["aten::neg"], sum("C++" in str(w.message) for w in caught))
print(result.errors[0].splitlines()[0])
print(observe.main(["--build"]))
"""


def test_without_a_compiler_the_profiler_backend_is_used(tmp_path):
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
           "TORCH_ADAPTER_PACKAGED_BUILDS": "off"}
    out = subprocess.run([sys.executable, "-c", NO_COMPILER], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "python 1 1"  # fell back; warned once for two observers
    assert lines[1].startswith("torch_adapter.routing.observe (building the C++ observer): expected a C++ compiler")
    assert "no C++ compiler" in out.stdout and "Fix: install g++" in out.stdout
    assert lines[-1] == "1"  # --build fails with exit code 1
