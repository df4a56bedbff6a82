"""Threads: the session is process-wide (shared by every thread; other settings from another
thread are an error, never silent sharing), and the hot paths count correctly across threads."""

from __future__ import annotations

import threading

import pytest
import torch

import torch_adapter
from torch_adapter.tools import debug
from torch_adapter import register_fallback
from torch_adapter.errors import UsageError


def _in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test thread
            out["error"] = exc

    t = threading.Thread(target=run, name="worker")
    t.start()
    t.join()
    return out


def test_other_settings_from_another_thread_are_an_error_and_change_nothing():
    session = torch_adapter.install(target="mps", simulate=True)

    def other():
        with torch_adapter.adapted(target="cpu"):
            pass

    out = _in_thread(other)
    assert isinstance(out.get("error"), UsageError)
    assert "from thread 'worker'" in str(out["error"]) and "installed it ('MainThread')" in str(out["error"])
    assert "process-wide" in str(out["error"])
    out = _in_thread(lambda: torch_adapter.install(target="cpu"))
    assert isinstance(out.get("error"), UsageError)
    out = _in_thread(lambda: torch_adapter.configure(fallback="error"))
    assert isinstance(out.get("error"), UsageError)
    assert torch_adapter.current() is session and session.active and session.config.fallback == "allow"


def test_same_settings_share_the_session_and_the_last_block_out_closes_it():
    inside, leave = threading.Event(), threading.Event()
    seen = {}

    def worker():
        with torch_adapter.adapted(target="cpu") as s:
            seen["session"] = s
            inside.set()
            leave.wait(30)
            seen["active_after_main_left"] = s.active and torch_adapter.current() is s

    with torch_adapter.adapted(target="cpu") as main:
        t = threading.Thread(target=worker)
        t.start()
        assert inside.wait(30)
    assert seen["session"] is main and main.active  # main left first: the worker is still inside
    leave.set()
    t.join()
    assert seen["active_after_main_left"] and main.closed and torch_adapter.current() is None


def test_an_outer_thread_that_ended_does_not_block_a_new_install():
    out = _in_thread(lambda: torch_adapter.install(target="cpu"))
    assert out["value"].owner.name == "worker"
    session = torch_adapter.install(target="cpu", amp_dtype="float32")  # the worker is gone: allowed
    assert torch_adapter.current() is session


def test_redirect_counts_do_not_lose_calls_across_threads():
    session = torch_adapter.install(target="cpu")
    barrier = threading.Barrier(4)

    def work():
        barrier.wait()
        for _ in range(500):
            torch.empty(1, device="cuda")  # one call site, counted in one row

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = [e for e in session.redirect_log.entries() if e.function == "work"]
    assert len(rows) == 1 and rows[0].count == 2000


def test_engine_reinstallation_never_lets_a_call_through_unrouted():
    session = torch_adapter.install(target="mps", simulate=True)
    register_fallback("aten::heaviside", lambda x, values: x * 0 + 7)
    stop = threading.Event()
    results = []

    def work():
        x, v = torch.zeros(2), torch.ones(())
        while not stop.is_set():
            results.append(torch.heaviside(x, v)[0].item())

    t = threading.Thread(target=work)
    t.start()
    try:
        for i in range(30):  # each configure() re-registers every override
            torch_adapter.configure(fallback="allow" if i % 2 else "warn")
    finally:
        stop.set()
        t.join()
    assert results and set(results) == {7.0}  # never the plain kernel's 1.0


def test_debug_checks_switched_off_from_another_thread():
    torch_adapter.install(target="cpu", debug_mode=True)
    with pytest.raises(Exception, match="aten::log"):
        torch.log(torch.tensor([-1.0]))
    out = _in_thread(lambda: torch_adapter.configure(debug_mode=False))
    assert isinstance(out.get("error"), UsageError)  # the session's owner decides its settings
    out = _in_thread(debug.disable_nan_check)  # the tool itself may be switched off from anywhere
    assert "error" not in out
    torch.log(torch.tensor([-1.0]))  # the mode left on this thread passes ops through
    torch_adapter.uninstall()  # the owning thread takes the stale mode off
    from torch_adapter.core.torch_private import dispatch_mode_stack

    assert dispatch_mode_stack() == []


def test_run_report_counts_ops_on_other_threads(tmp_path, cli):
    script = tmp_path / "two.py"
    script.write_text("import threading, torch\n"
                      "def work():\n"
                      "    a = torch.randn(4, 4, device='cuda')\n"
                      "    for _ in range(20):\n"
                      "        torch.mm(a, a)\n"
                      "ts = [threading.Thread(target=work) for _ in range(2)]\n"
                      "[t.start() for t in ts]; [t.join() for t in ts]\n")
    report = tmp_path / "r.json"
    out = cli("run", "--report-json", str(report), str(script))
    assert out.returncode == 0, out.stderr
    import json

    entries = json.loads(report.read_text())["ops"]
    assert sum(e["calls"] for e in entries if e["op"] == "aten::mm") == 40


def test_a_probe_in_progress_on_one_thread_is_no_cycle_for_another():
    """self_decomp's cycle guard was one global set: a probe of the same op running on another
    thread looked like a cycle, and the unknown answer (None) was cached for good."""
    import threading

    from torch_adapter.routing import self_decomp

    key = ("aten::var.correction", None)
    self_decomp.calls_itself.cache_clear()
    self_decomp._PROBING.now.add(key)  # this thread is in the middle of probing it
    try:
        answers: list = []
        worker = threading.Thread(target=lambda: answers.append(self_decomp.calls_itself(*key)))
        worker.start()
        worker.join()
    finally:
        self_decomp._PROBING.now.discard(key)
        self_decomp.calls_itself.cache_clear()
    assert answers == [True]


def test_redirect_log_is_read_while_threads_record():
    """RedirectLog.entries()/summary() iterated the live dict: a thread recording a new row meanwhile
    raised 'dictionary changed size during iteration' in the reader."""
    import threading

    from torch_adapter.redirect.log import RedirectLog

    log = RedirectLog()
    stop = threading.Event()

    def writer(tag: str) -> None:
        i = 0
        while not stop.is_set() and i < 200_000:
            log.record("device", f"{tag}-{i}", "cpu", depth=1)
            i += 1

    threads = [threading.Thread(target=writer, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    errors = []
    try:
        for _ in range(300):
            try:
                log.summary()
                log.entries()
            except RuntimeError as exc:
                errors.append(exc)
                break
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert log.summary()["device"] == len(log)


def test_trace_in_a_simulated_session_counts_the_ops_of_threads_started_in_the_block():
    """trace() (recorder mode) counted 0 of 40 mm made by two worker threads; a pool thread that
    outlived the block kept recording into its log."""
    import threading

    torch_adapter.install(target="mps", simulate=True)
    a = torch.randn(8, 8, device="cuda")
    go_on, done = threading.Event(), threading.Event()

    def work():
        for _ in range(20):
            torch.mm(a, a)

    def pool():  # started in the block, used after it
        work()
        go_on.wait(60)
        work()
        done.set()

    with torch_adapter.trace(use_observer=False) as log:
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lingering = threading.Thread(target=pool)
        lingering.start()
        import time

        deadline = time.monotonic() + 30
        while log.summary()["native"] < 60 and time.monotonic() < deadline:
            threading.Event().wait(0.01)
    counted = log.summary()["native"]
    go_on.set()
    done.wait(60)
    lingering.join()
    assert counted == 60, log.summary()  # 2 × 20 + the pool thread's first 20 mm
    assert log.summary()["native"] == 60, "a thread outliving the block kept recording into its log"


def test_a_first_import_of_dynamo_does_not_unpatch_torch_for_other_threads():
    """torch._dynamo's first import in a session ran with the patches suspended for every thread:
    a second thread's device="cuda" factory met torch's own meanwhile ("Torch not compiled with CUDA
    enabled"; run --report of a two-thread script lost one thread under load)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, threading, torch, torch_adapter
        assert "torch._dynamo" not in sys.modules
        torch_adapter.install(target="cpu")
        errors, stop = [], threading.Event()

        def factories():
            while not stop.is_set():
                try:
                    torch.zeros(1, device="cuda")
                except Exception as exc:
                    errors.append(repr(exc))
                    return

        t = threading.Thread(target=factories)
        t.start()
        import torch._dynamo  # the first import, while the other thread runs
        stop.set()
        t.join()
        assert not errors, errors
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_a_thread_that_outlives_trace_leaves_with_no_recorder_on_its_stack():
    """A pool thread followed by trace(threads=True) kept its recorder on its own dispatch-mode stack
    after the block (every op through a Python mode for the thread's life); now it leaves at the
    thread's next op."""
    import threading

    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    torch_adapter.install(target="mps", simulate=True)
    a = torch.randn(4, 4, device="cuda")
    first, go_on, stacks = threading.Event(), threading.Event(), []

    def mm():
        return torch.mm(a, a)

    def pool():
        mm()
        stacks.append([type(m).__name__ for m in _get_current_dispatch_mode_stack()])
        first.set()
        go_on.wait(60)
        mm()  # the first op after the block: the recorder sees it is retired
        mm()
        stacks.append([type(m).__name__ for m in _get_current_dispatch_mode_stack()])

    with torch_adapter.trace(use_observer=False, threads=True) as log:
        t = threading.Thread(target=pool)
        t.start()
        assert first.wait(60)
    go_on.set()
    t.join(60)
    assert "Recorder" in stacks[0], stacks  # followed while the block ran
    assert "Recorder" not in stacks[1], stacks
    assert log.summary()["native"] == 1
