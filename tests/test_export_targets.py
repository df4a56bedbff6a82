"""export(target=...) to incomplete profiles: warned or refused; the artifact keeps core ATen ops only
(no prims::*), and what the target still lacks is listed per op."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn as nn

from torch_adapter.errors import UsageError
from torch_adapter.tools.exporting import export


class Stats(nn.Module):
    """On mtia's short table: layer norm and gelu decompose only via prims-based refs; var's
    decomposition calls var itself; ndtri's too."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).var(dim=1) + torch.special.ndtri(torch.sigmoid(x)).sum(1)


def _graph_ops(program) -> set[str]:
    return {n.target.name() for n in program.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


@pytest.fixture(scope="module")
def on_mtia(tmp_path_factory):
    x = torch.randn(4, 8)
    path = tmp_path_factory.mktemp("export") / "stats.pt2"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export(Stats().eval(), (x,), target="mtia", path=path)
    return x, result, [str(w.message) for w in caught]


def test_incomplete_profile_warns_and_says_so_in_the_report(on_mtia):
    _, result, messages = on_mtia
    assert any("the mtia profile is incomplete" in m for m in messages)
    report = json.loads(result.report_path.read_text())
    assert report["notes"] and "incomplete" in report["notes"][0]


def test_no_prims_in_the_artifact_and_leftovers_per_op(on_mtia):
    x, result, _ = on_mtia
    ops = _graph_ops(result.program)
    assert not [op for op in ops if op.startswith("prims::")], ops
    left = {row["op"]: row for row in result.leftovers}
    assert left["aten::var.correction"]["route"] == "fallback"
    assert "calls the op itself" in left["aten::var.correction"]["reason"]
    assert left["aten::gelu"]["route"] == "composite" and "core ATen" in left["aten::gelu"]["reason"]
    assert all(row["nodes"] >= 1 and row["graph_op"] in ops for row in result.leftovers)
    torch.testing.assert_close(result.module()(x), Stats().eval()(x))


def test_incomplete_profile_refused_on_request():
    with pytest.raises(UsageError, match=r"(?s)target='mtia'\): expected a complete capability profile.*incomplete="):
        export(Stats().eval(), (torch.randn(4, 8),), target="mtia", incomplete="raise")
    with pytest.raises(UsageError, match=r"incomplete=...\): expected 'warn' or 'raise'"):
        export(Stats().eval(), (torch.randn(4, 8),), target="mtia", incomplete="ignore")


def test_complete_vendor_profile_exports_without_a_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torch_adapter.export")
        result = export(Stats().eval(), (torch.randn(4, 8),), target="xpu")
    assert result.notes == [] and result.fallbacks == []
