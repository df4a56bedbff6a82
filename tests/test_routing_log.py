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
        {"schema": SCHEMA, "version": 2, "target": "mps", "simulated": True}
    assert set(data["summary"]) == {"native", "composite", "yours", "fallback", "refused"}
    assert sum(data["summary"].values()) == sum(op["calls"] for op in data["ops"])
    for op in data["ops"]:
        assert OP_KEYS <= set(op)
        assert op["route"] in ("native", "composite", "yours", "fallback", "refused")
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
    order = ["refused", "fallback", "composite", "yours", "native"]
    top = [order.index(r["route"]) for r in rows if r["parent"] is None]
    assert rows[0]["parent"] is None and top == sorted(top)  # what needs a look first
    eigh = next(i for i, r in enumerate(rows) if r["op"] == "aten::_linalg_eigh")
    assert rows[eigh]["route"] == "fallback" and rows[eigh]["parent"] in {r["op"] for r in rows[:eigh]}
    text = log.render(width=160)
    assert "Routing on mps (simulated)" in text and "aten::_linalg_eigh" in text and "fallback" in text
    from rich.table import Table

    assert isinstance(log.__rich__(), Table)
    assert "CPU fallback calls" in repr(log)
    big = RoutingLog("mps", True)
    big.add("aten::nonzero", "fallback", bytes_to_cpu=3000, bytes_from_cpu=3 << 20)
    assert "3.0 MiB" in big.render() and "3.0 MiB copied" in repr(big)  # binary units, as the Lab pill


def test_add_and_merge_for_other_producers():
    a = RoutingLog("npu")
    a.add("aten::add.Tensor", "native", calls=3, self_time_ns=1000, reason="npu kernel")
    a.add("aten::nonzero", torch_adapter.Route.FALLBACK, calls=1, bytes_to_cpu=10, bytes_from_cpu=6, reason="r")
    b = RoutingLog("npu")
    b.add("aten::add.Tensor", "native", calls=2)
    b.add("aten::mul.Tensor", "native", calls=1, parent="aten::linear")
    a.merge(b)
    assert a.summary() == {"native": 6, "composite": 0, "yours": 0, "fallback": 1, "refused": 0}
    assert a.bytes_copied == 16
    rows = {(r["op"], r["parent"]): r for r in a.table()}
    assert rows[("aten::add.Tensor", None)]["calls"] == 5 and rows[("aten::add.Tensor", None)]["reason"] == "npu kernel"
    assert rows[("aten::mul.Tensor", "aten::linear")]["calls"] == 1


def test_log_errors():
    with pytest.raises(UsageError, match=r"RoutingLog\.add\(route=\.\.\.\): expected one of \('native', 'composite', "
                                         r"'yours', 'fallback', 'refused'\) or a Route, got 'gpu'"):
        RoutingLog().add("aten::add.Tensor", "gpu")
    with pytest.raises(UsageError, match=r"from_dict\(\): expected schema 'torch-adapter\.routing-log' version 1 or 2, "
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


def test_a_version_1_log_is_still_read():
    old = {"schema": SCHEMA, "version": 1, "target": "mps", "simulated": True,
           "summary": {"native": 1, "composite": 0, "fallback": 0},
           "ops": [{"op": "aten::mm", "route": "native", "calls": 1, "self_time_ms": 0.1, "bytes_copied": 0}]}
    assert RoutingLog.from_dict(old).summary()["native"] == 1


def test_the_tree_puts_every_child_under_its_own_parent():
    # Nested calls (a custom op whose pieces run a composite op with pieces of its own), listed
    # in an order that sorts the parents apart from their children; an orphan's parent has no entry.
    log = RoutingLog("mps", True)
    log.add("demo::outer", "native", calls=1)
    log.add("aten::add.Tensor", "native", calls=9)
    log.add("aten::linear", "composite", calls=2, parent="demo::outer")
    log.add("aten::mm", "native", calls=2, parent="aten::linear")
    log.add("aten::t", "native", calls=2, parent="aten::linear")
    log.add("aten::gelu", "native", calls=1, parent="demo::outer")
    log.add("aten::bitwise_or_.Tensor", "native", calls=5)
    log.add("aten::nonzero", "fallback", calls=1, parent="optimize::Gone")
    log.add("aten::mm", "native", calls=4)
    shown = [(depth, r.op) for depth, r in log.tree()]
    assert shown == [
        (0, "aten::add.Tensor"), (0, "aten::bitwise_or_.Tensor"), (0, "aten::mm"),
        (0, "demo::outer"), (1, "aten::linear"), (2, "aten::mm"), (2, "aten::t"), (1, "aten::gelu"),
        (1, "aten::nonzero")]  # its parent has no entry: listed apart, last
    assert [r.op for r in log.records()] == [op for _, op in shown]
    for depth, rec in log.tree():  # each child follows its parent (or a sibling of that parent's)
        if depth:
            above = [r for d, r in log.tree()[:log.tree().index((depth, rec))] if d == depth - 1]
            assert rec.parent in ("optimize::Gone", above[-1].op)
    text = log.render(width=160)
    lines = [line for line in text.splitlines() if "aten::" in line or "demo::" in line]
    assert [line.split("│")[1].rstrip() for line in lines][3:8] == [
        " demo::outer", "   └ aten::linear", "     └ aten::mm", "     └ aten::t", "   └ aten::gelu"]


def test_registered_fallbacks_are_yours_and_refused_calls_are_refused():
    import torch_adapter.errors as errors

    torch_adapter.install(target="mps", simulate=True)
    emb = torch.randn(16, 4)
    handle = torch_adapter.register_fallback("aten::_pdist_forward", lambda x, p=2.0: torch.cdist(x, x, p=p)[
        tuple(torch.triu_indices(len(x), len(x), 1))])
    for use_observer in (None, False):
        with trace(use_observer=use_observer) as log:
            torch.pdist(emb)
        assert log.routes()["aten::_pdist_forward"] == "yours" and log.bytes_copied == 0, log.table()
        assert log.summary()["fallback"] == 0
    handle.remove()
    torch_adapter.configure(fallback="error")
    for use_observer in (None, False):
        with trace(use_observer=use_observer) as log:
            with pytest.raises(errors.FallbackError, match="aten::_pdist_forward"):
                torch.pdist(emb)
        (rec,) = [r for r in log.records() if r.op == "aten::_pdist_forward"]
        assert (rec.route, rec.calls, log.summary()["fallback"]) == ("refused", 1, 0), log.table()
        assert 'refused: the fallback policy is "error"' in rec.reason
    assert torch_adapter.explain("aten::_pdist_forward").route is torch_adapter.Route.REFUSED
    torch_adapter.configure(fallback="allow")
    assert torch_adapter.explain("aten::_pdist_forward").route is torch_adapter.Route.FALLBACK
