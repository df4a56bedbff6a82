"""torch_adapter's own work is in no routing report: ``routing.internal.internal()`` honoured by
both observer backends, trace()'s recorder and the engine's logs; the self-decomposition
probe, export and the debug tools run under it; a notebook cell that calls ``targets()`` for
the first time in a fresh kernel reports only the user's ops (a real IPython shell)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import torch_adapter
from torch_adapter.routing.internal import active, internal
from torch_adapter.routing.observe import is_op_key
from torch_adapter.routing.trace import trace

from _observers import backend, observed  # noqa: F401 - backend is a fixture


def test_ops_inside_internal_are_not_counted_and_ops_around_it_are(backend):
    a = torch.ones(3)

    def work():
        torch.add(a, a)
        with internal():
            assert active()
            torch.mul(a, a)
            with internal():  # nests
                torch.sin(a)
            torch.mul(a, a)  # still inside after the inner block ended
        assert not active()
        torch.sub(a, a)

    result = observed(backend, work)
    assert result.ops() == {"aten::add.Tensor": 1, "aten::sub.Tensor": 1}


def test_internal_is_per_thread(backend):
    a = torch.ones(2)
    started, release = threading.Event(), threading.Event()

    def user_thread():
        started.set()
        release.wait(10)
        for _ in range(4):
            torch.mul(a, a)

    def work():
        t = threading.Thread(target=user_thread)
        t.start()
        started.wait(10)
        with internal():  # this thread's own work only: the other thread's ops are the user's
            release.set()
            t.join()
            torch.sin(a)

    result = observed(backend, work)
    assert result.ops() == {"aten::mul.Tensor": 4}


def test_internal_survives_an_exception_in_the_block(backend):
    a = torch.ones(2)

    def work():
        with pytest.raises(ValueError), internal():
            torch.sin(a)
            raise ValueError("boom")
        torch.cos(a)

    assert observed(backend, work).ops() == {"aten::cos": 1}


def test_the_self_decomposition_probe_is_not_observed(backend):
    from torch_adapter.routing import self_decomp

    self_decomp.calls_itself.cache_clear()  # the probe runs afresh
    a = torch.ones(2)

    def work():
        assert self_decomp.calls_itself("aten::var.correction", None) is True  # the probe ran ops
        torch.add(a, a)

    assert observed(backend, work).ops() == {"aten::add.Tensor": 1}


@pytest.mark.parametrize("use_observer", [None, False], ids=["observer+engine", "recorder+engine"])
def test_the_engine_routes_internal_ops_but_no_trace_logs_them(use_observer):
    x = torch.eye(3) * 2
    torch_adapter.install("mps", simulate=True)
    try:
        with trace(use_observer=use_observer) as log:
            with internal():
                internal_out = torch.linalg.eigh(x)  # aten::_linalg_eigh falls back on mps
            user_out = torch.linalg.eigh(x)
        with trace(use_observer=use_observer) as inside_only:
            with internal():
                torch.linalg.eigh(x)
    finally:
        torch_adapter.uninstall()
    assert torch.equal(internal_out.eigenvalues, user_out.eigenvalues)
    (eigh,) = [e for e in log.entries.values() if e.op == "aten::_linalg_eigh"]
    assert eigh.route == "fallback" and eigh.calls == 1  # the user's call only
    assert sum(inside_only.summary().values()) == 0


def test_export_tracing_is_not_observed(backend):
    class Net(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x) + 1

    x = torch.ones(4)
    result = observed(backend, lambda: torch_adapter.export(Net(), (x,), target="mps"))
    assert result.ops() == {}
    assert sum(torch_adapter.export(Net(), (x,), target="mps").routes.values()) > 0  # it did trace ops


def test_debug_checks_are_not_observed(backend):
    from torch_adapter.tools import debug

    a = torch.ones(8)

    def work():
        debug.enable_nan_check()
        try:
            torch.sin(a)
        finally:
            debug.disable_nan_check()

    # the check's own isnan/isinf/sum calls are not counted, nor the tool's mode re-dispatching sin
    result = observed(backend, work)
    assert result.ops() == {"aten::sin": 1} and op_children(result) == {}


def test_a_tool_mode_re_dispatch_is_counted_once_with_the_ops_pieces(backend):
    from torch_adapter.tools import memory

    a = torch.ones(4, 4)

    def step():
        torch.nn.functional.linear(a, a).relu()  # linear: composite above the mode, its pieces reach it

    plain = observed(backend, step)
    memory.track(True, min_bytes=0)  # the memory tool's mode handles every op below autograd
    try:
        tracked = observed(backend, step)
    finally:
        memory.track(False)
    assert tracked.ops() == plain.ops()
    assert op_children(tracked) == op_children(plain)  # the same pieces under the same ops
    assert "aten::mm" in op_children(tracked)["aten::matmul"]


def op_children(result):
    """``children`` between dispatcher ops (a mode's named "PythonDispatchMode" range looked through)."""
    out = {}
    for parent, kids in result.children.items():
        for kid, n in kids.items():
            if is_op_key(kid):
                key = parent if is_op_key(parent) else None
                out.setdefault(key, {})[kid] = out.get(key, {}).get(kid, 0) + n
    return out


# -- a real IPython shell in a fresh process ---------------------------------------------------
_SHELL_SCRIPT = textwrap.dedent("""
    import json
    from IPython.testing import globalipapp
    from IPython.utils.capture import capture_output
    from torch_adapter.jupyter import schema
    from torch_adapter.routing import choose, self_decomp

    ip = globalipapp.start_ipython() or globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "torch_adapter")

    def cell(code):
        before = self_decomp.calls_itself.cache_info().misses
        with capture_output() as cap:
            assert ip.run_cell(code).success
        payloads = [o.data[schema.MIME] for o in cap.outputs if schema.MIME in o.data]
        probed = self_decomp.calls_itself.cache_info().misses - before
        return {"counts": [p["counts"] for p in payloads], "probed": probed}

    out = {"targets": cell("import torch, torch_adapter\\nrows = torch_adapter.targets()\\n")}
    choose.clear_caches()  # the next cell probes afresh too
    self_decomp.calls_itself.cache_clear()
    out["targets+user"] = cell("rows = torch_adapter.targets()\\ny = torch.ones(4).relu() + 1\\n")
    out["user"] = cell("y = torch.ones(4).relu() + 1\\n")
    print("RESULT " + json.dumps(out))
""")


def test_a_first_targets_call_in_a_notebook_cell_reports_no_op_calls(tmp_path):
    script = tmp_path / "shell.py"
    script.write_text(_SHELL_SCRIPT)
    env = dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))
    assert out["targets"]["probed"] > 0  # the probe really ran in that cell, on ops of its own
    assert out["targets"]["counts"] == []  # ...and the cell ran no op of the user's: nothing published
    assert out["targets+user"]["probed"] > 0
    user = out["user"]["counts"]
    assert len(user) == 1 and sum(user[0].values()) > 0
    assert out["targets+user"]["counts"] == user  # the user's ops only, all of them
