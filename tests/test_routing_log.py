"""RoutingLog and trace(): the versioned JSON, table, rich rendering, add/merge, nesting."""

from __future__ import annotations

import json

import pytest
import torch

import torch_adapter
from torch_adapter.errors import UsageError
from torch_adapter.routing.log import SCHEMA, RoutingLog
from torch_adapter.routing.trace import trace

OP_KEYS = {"op", "route", "calls", "self_time_ms", "bytes_copied", "reason", "via", "site", "parent"}


def _traced_mps_step() -> RoutingLog:
    torch_adapter.install(target="mps", simulate=True)
    x = torch.randn(4, 4, requires_grad=True)
    with trace() as log:
        y = torch.linalg.eigh(x @ x.T)[0].sum() + torch.heaviside(x.detach(), torch.tensor(0.5)).sum()
        y.backward()
    return log


def test_to_json_follows_the_schema():
    data = json.loads(_traced_mps_step().to_json())
    assert {k: data[k] for k in ("schema", "version", "target", "simulated")} == \
        {"schema": SCHEMA, "version": 1, "target": "mps", "simulated": True}
    assert set(data["summary"]) == {"native", "composite", "fallback"}
    assert sum(data["summary"].values()) == sum(op["calls"] for op in data["ops"])
    for op in data["ops"]:
        assert OP_KEYS <= set(op)
        assert op["route"] in ("native", "composite", "fallback")
        assert op["op"].count("::") == 1 and " " not in op["op"]
        assert isinstance(op["calls"], int) and isinstance(op["self_time_ms"], float)
        assert op["site"] is None or set(op["site"]) == {"file", "line", "function"}
    names = {op["op"] for op in data["ops"]}
    assert {"aten::_linalg_eigh", "aten::heaviside", "aten::mm"} <= names  # overload names as the dispatcher has them
    eigh = next(op for op in data["ops"] if op["op"] == "aten::_linalg_eigh")
    assert eigh["site"]["file"] == __file__ and eigh["bytes_copied"] > 0 and eigh["via"] == "cpu"
    assert any(op["parent"] == "aten::heaviside" for op in data["ops"])


def test_round_trip_summary_table_and_rendering():
    log = _traced_mps_step()
    again = RoutingLog.from_json(log.to_json())
    assert again.table() == log.table() and again.summary() == log.summary()
    rows = log.table()
    assert rows[0]["route"] == "fallback"  # fallbacks first
    text = log.render(width=160)
    assert "Routing on mps (simulated)" in text and "aten::_linalg_eigh" in text and "fallback" in text
    from rich.table import Table

    assert isinstance(log.__rich__(), Table)
    assert "fallback calls" in repr(log)


def test_add_and_merge_for_other_producers():
    a = RoutingLog("npu")
    a.add("aten::add.Tensor", "native", calls=3, self_time_ns=1000, reason="npu kernel")
    a.add("aten::nonzero", torch_adapter.Route.FALLBACK, calls=1, bytes_to_cpu=10, bytes_from_cpu=6, reason="r")
    b = RoutingLog("npu")
    b.add("aten::add.Tensor", "native", calls=2)
    b.add("aten::mul.Tensor", "native", calls=1, parent="aten::linear")
    a.merge(b)
    assert a.summary() == {"native": 6, "composite": 0, "fallback": 1}
    assert a.bytes_copied == 16
    rows = {(r["op"], r["parent"]): r for r in a.table()}
    assert rows[("aten::add.Tensor", None)]["calls"] == 5 and rows[("aten::add.Tensor", None)]["reason"] == "npu kernel"
    assert rows[("aten::mul.Tensor", "aten::linear")]["calls"] == 1


def test_log_errors():
    with pytest.raises(UsageError, match=r"RoutingLog\.add\(route=\.\.\.\): expected one of \('native', 'composite', "
                                         r"'fallback'\) or a Route, got 'gpu'"):
        RoutingLog().add("aten::add.Tensor", "gpu")
    with pytest.raises(UsageError, match=r"from_dict\(\): expected schema 'torch-adapter\.routing-log' version 1, "
                                         r"got schema 'other' version 3"):
        RoutingLog.from_dict({"schema": "other", "version": 3})


def test_trace_without_install_uses_this_machine():
    with trace() as log:
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    assert log.target == "cpu" and not log.simulated
    assert log.routes()["aten::mm"] == "native"
    assert log.meta["source"] in ("observer:cpp", "observer:python", "recorder")


def test_nested_traces_each_get_their_scope():
    torch_adapter.install(target="mps", simulate=True)
    a = torch.randn(3, 3)
    with trace() as outer:
        torch.mm(a, a)
        with trace() as inner:
            torch.linalg.eigh(a @ a.T)
    assert inner.routes().keys() >= {"aten::_linalg_eigh", "aten::mm"}
    assert "aten::_linalg_eigh" in outer.routes()
    assert outer.summary()["native"] == inner.summary()["native"] + 1
    assert outer.meta["source"].endswith("+engine") and outer.meta["duration_s"] >= inner.meta["duration_s"]


def test_nested_recorder_traces_share_one_recorder():
    torch_adapter.install(target="mps", simulate=True)
    a = torch.randn(3, 3)
    with trace(use_observer=False) as outer:
        torch.mm(a, a)
        with trace(use_observer=False) as inner:
            torch.linalg.eigh(a @ a.T)
    assert inner.routes(parent=None).keys() >= {"aten::_linalg_eigh", "aten::mm"}
    assert outer.summary()["native"] == inner.summary()["native"] + 1
    assert outer.meta["source"] == inner.meta["source"] == "recorder+engine"
