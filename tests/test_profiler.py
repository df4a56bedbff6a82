"""torch_adapter.profiler: a real torch.profiler run, exported as a Chrome trace that carries
the routing (routes in op args, fallback copies as slices, steps as ranges) and validated the
way Perfetto / chrome://tracing need it."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn as nn

import torch_adapter
from torch_adapter.tools import profiler
from torch_adapter.errors import UsageError


class Lacking(nn.Module):
    """On simulated MPS: heaviside decomposes (composite), _aminmax runs on the CPU (fallback)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        lo, hi = torch.ops.aten._aminmax.default(h.detach())
        return torch.heaviside(h.detach(), torch.zeros(())) * h + lo + hi


def _record(steps: int = 2) -> tuple[profiler.Recording, object]:
    session = torch_adapter.install(target="mps", simulate=True)
    model = Lacking().cuda()
    x = torch.randn(4, 8, device="cuda")
    with profiler.record("loop") as rec:
        for _ in range(steps):
            with profiler.step("train"):
                model(x).sum().backward()
    return rec, session


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    import torch_adapter.session

    rec, _ = _record()
    path = profiler.export(tmp_path_factory.mktemp("trace") / "trace.json")
    torch_adapter.session.uninstall()
    return rec, json.loads(path.read_text()), path


def test_trace_is_valid_chrome_trace_format(recorded):
    _, trace, path = recorded
    assert profiler.validate(path) == []
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    for e in trace["traceEvents"]:
        assert isinstance(e["ph"], str) and "name" in e and "pid" in e and "tid" in e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
    json.dumps(trace, allow_nan=False)  # strict JSON: Perfetto rejects NaN


def test_steps_are_ranges_on_their_own_track(recorded):
    _, trace, _ = recorded
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert [(s["name"], s["args"]["index"]) for s in steps] == [("train", 0), ("train", 1)]
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert names[steps[0]["tid"]].startswith("torch_adapter: steps")
    record = [e for e in trace["traceEvents"] if e.get("cat") == "record"]
    assert record[0]["name"] == "loop" and record[0]["ts"] <= steps[0]["ts"]


def test_op_events_name_route_and_reason(recorded):
    _, trace, _ = recorded
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    assert ops and all("route" in e["args"] and "reason" in e["args"] for e in ops if e["name"].startswith("aten::"))
    by_name = {e["name"]: e["args"] for e in ops}
    assert by_name["aten::heaviside"]["route"] == "composite"
    assert "decomposes via torch._decomp" in by_name["aten::heaviside"]["reason"]
    assert by_name["aten::_aminmax"]["route"] == "fallback" and by_name["aten::_aminmax"]["via"] == "cpu"
    addmm = by_name["aten::addmm"]
    assert (addmm["route"], addmm["reason"]) == ("native", "mps has its own MPS kernel")


def test_fallback_copies_are_slices_with_the_engines_bytes(recorded):
    rec, trace, _ = recorded
    copies = [e for e in trace["traceEvents"] if e.get("cat") == "fallback_copy"]
    assert {c["args"]["direction"] for c in copies} == {"to_cpu", "from_cpu"}
    assert all(c["args"]["op"] == "aten::_aminmax" for c in copies)
    engine = {r["op"]: r for r in trace["torch_adapter"]["routing"]["ops"]}["aten::_aminmax"]
    to_cpu = sum(c["args"]["bytes"] for c in copies if c["args"]["direction"] == "to_cpu")
    from_cpu = sum(c["args"]["bytes"] for c in copies if c["args"]["direction"] == "from_cpu")
    assert (to_cpu, from_cpu) == (engine["bytes_to_cpu"], engine["bytes_from_cpu"]) == (2 * 4 * 8 * 4, 2 * 2 * 4)
    tracks = {e["tid"] for e in copies}
    op_tracks = {e["tid"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert not tracks & op_tracks  # their own track, so slices nest properly


def test_summary_has_one_row_per_step(recorded):
    rec, _, _ = recorded
    s = profiler.summary(rec)
    assert [(r["name"], r["index"]) for r in s.rows] == [("train", 0), ("train", 1)]
    for r in s.rows:
        assert r["fallback_calls"] >= 1 and r["calls"]["composite"] >= 1 and r["bytes_copied"] == 4 * 8 * 4 + 2 * 4
        assert r["wall_ms"] > 0 and r["ops"] == sum(r["calls"].values())
    text = str(s)
    assert "train #0" in text and "train #1" in text and "fallback" in text
    assert s.to_dict()["steps"] == s.rows


def test_without_steps_the_recording_is_one_row_and_host_ops_do_not_fall_back():
    model = nn.Linear(4, 4)
    with profiler.record("eager") as rec:
        model(torch.randn(2, 4))
    trace = rec.trace()
    assert profiler.validate(trace) == []
    assert trace["torch_adapter"]["target"] == "cpu" and trace["torch_adapter"]["routing_source"] == "profile"
    routes = {e["name"]: e["args"]["route"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert routes["aten::addmm"] == "native" and routes["aten::linear"] == "composite"  # CompositeImplicit
    assert "fallback" not in routes.values()
    assert [r["name"] for r in rec.summary().rows] == ["eager"]


def test_step_outside_record_does_nothing():
    with profiler.step("forward"):
        y = torch.ones(2) + 1
    assert y.sum() == 4


def test_nested_record_and_bad_names_are_usage_errors():
    with profiler.record("outer"):
        with pytest.raises(UsageError, match=r"(?s)record\('inner'\): expected no recording already running.*"
                                             r"recording 'outer' still open.*Fix: end the outer"):
            with profiler.record("inner"):
                pass
        with pytest.raises(UsageError, match=r"step\(name\): expected a non-empty string without '#'"):
            with profiler.step("a#b"):
                pass
    with pytest.raises(UsageError, match=r"record\(name\): expected a non-empty string"):
        with profiler.record(""):
            pass


def test_export_without_a_recording_is_a_usage_error(monkeypatch, tmp_path):
    monkeypatch.setattr(profiler, "_LAST", None)
    with pytest.raises(UsageError,
                       match=r"(?s)export\('.*t.json'\): expected a finished .*record\(\) block.*Fix: wrap"):
        profiler.export(tmp_path / "t.json")


def test_a_busy_profiler_leaves_the_block_running_unprofiled(tmp_path):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.warns(profiler.ProfilerWarning, match="another torch profiler is already running"):
            with profiler.record("late") as rec:
                y = torch.ones(3) * 2
    assert y.sum() == 6 and not rec.profiled
    with pytest.raises(UsageError, match=r"(?s)expected a recording that profiled its block.*"
                                         r"another torch profiler is already running"):
        rec.export(tmp_path / "late.json")


@pytest.mark.parametrize(("trace", "problem"), [
    ({"events": []}, "no 'traceEvents' list"),
    ({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0}]}, "'dur' is None"),
    ({"traceEvents": [{"ph": "Q", "name": "a"}]}, "not a Trace Event Format phase"),
    ({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": float("nan"), "dur": 1}]}, "not strict JSON"),
    ({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
                      {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 10}]},
     "overlaps 'a' without nesting"),
])
def test_validate_names_what_viewers_reject(trace, problem):
    problems = profiler.validate(trace)
    assert problems and problem in problems[0]


def test_record_keeps_user_exceptions_and_cleans_up():
    with pytest.raises(ZeroDivisionError):
        with profiler.record("boom"):
            raise ZeroDivisionError
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with profiler.record("after"):
            torch.ones(1)
    assert profiler.last().name == "after"
