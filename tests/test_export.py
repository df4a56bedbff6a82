"""torch_adapter.export: a torch.export program lowered to the target's native ops by the routing
decisions, saved as .pt2 with its routing report; loaded back it computes the same outputs."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_adapter
from torch_adapter.errors import UsageError
from torch_adapter.tools.exporting import ExportResult, export


class Lacking(nn.Module):
    """On MPS: heaviside and special_log_ndtr decompose; eigvalsh's _linalg_eigh has no decomposition."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x)
        y = torch.heaviside(h, torch.zeros(())) + torch.special.log_ndtr(h)
        return F.gelu(y), torch.linalg.eigvalsh(h @ h.T)


def _ops(program) -> set[str]:
    return {n.target.name() for n in program.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = Lacking().eval()
    x = torch.randn(4, 8)
    path = tmp_path_factory.mktemp("export") / "lacking.pt2"
    return model, x, export(model, (x,), target="mps", path=path)


def test_lowered_to_the_targets_native_ops(exported):
    _, _, result = exported
    ops = _ops(result.program)
    assert {"aten::heaviside", "aten::special_log_ndtr", "aten::linalg_eigvalsh"}.isdisjoint(ops)
    assert {"aten::heaviside", "aten::special_log_ndtr", "aten::linalg_eigvalsh"} <= set(result.decomposed)
    assert "aten::linear" in ops and "aten::gelu" in ops  # MPS has its own kernels: kept as they are
    assert [f["op"] for f in result.fallbacks] == ["aten::_linalg_eigh"]
    assert "no MPS kernel and no decomposition" in result.fallbacks[0]["reason"]
    assert sum(result.routes.values()) == sum(1 for n in result.program.graph.nodes if n.op == "call_function"
                                              and isinstance(n.target, torch._ops.OpOverload))
    assert isinstance(result, ExportResult) and "1 would fall back" in repr(result)


def test_saved_program_and_report_load_and_compute_the_same(exported):
    model, x, result = exported
    assert result.path.exists() and result.report_path == result.path.with_name("lacking.routing.json")
    report = json.loads(result.report_path.read_text())
    assert report["schema"] == "torch-adapter.export" and report["target"] == "mps"
    assert report["fallbacks"] == result.fallbacks and report["decomposed"] == result.decomposed
    loaded = torch.export.load(str(result.path))
    torch.testing.assert_close(loaded.module()(x), model(x))
    x2 = torch.randn(4, 8)
    torch.testing.assert_close(result.module()(x2), model(x2))


def test_host_target_keeps_native_ops_and_nothing_falls_back():
    model = Lacking().eval()
    x = torch.randn(4, 8)
    result = export(model, (x,), target="cpu")
    assert result.fallbacks == [] and result.path is None and result.target == "cpu"
    assert "aten::heaviside" in _ops(result.program)  # the CPU has its own kernel
    torch.testing.assert_close(result.module()(x), model(x))


def test_default_target_is_the_installed_one():
    torch_adapter.install(target="mps", simulate=True)
    result = export(Lacking().eval(), (torch.randn(4, 8),))
    assert result.target == "mps" and "aten::heaviside" in result.decomposed


def test_training_unsafe_decompositions_are_not_used():
    class Attend(nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, q, q)

    q = torch.randn(1, 2, 4, 8)
    result = export(Attend(), (q,), target="mps")
    assert result.fallbacks == []  # the host's attention kernel is no fallback of the target's
    (row,) = result.composite  # mps runs its math path in its place
    assert row["op"] == "aten::_scaled_dot_product_attention_math" and row["via"] == "device-selected"
    assert "this host ran its own aten::_scaled_dot_product_flash_attention_for_cpu" in row["reason"]
    # its export-only decomposition is on the training-unsafe deny-list: not used, the node stays
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in _ops(result.program)
    (left,) = result.leftovers
    assert left["graph_op"] == "aten::_scaled_dot_product_flash_attention_for_cpu" and left["route"] == "composite"
    torch.testing.assert_close(result.module()(q), Attend()(q))


@pytest.mark.parametrize(("args", "kwargs", "pattern"), [
    ((lambda x: x, (torch.ones(1),)), {}, r"export\(model, example_inputs, ...\): expected an nn.Module, got "),
    ((nn.Linear(2, 2), {"x": 1}), {},
     r"expected example_inputs as a tuple of the model's positional arguments, got dict"),
    ((nn.Linear(2, 2), (torch.ones(2),)), {"path": "model.onnx"},
     r"(?s)path='model.onnx'\): expected a path ending in .pt2.*Fix: path='model.pt2'"),
    ((nn.Linear(2, 2), (torch.ones(2),)), {"target": "tpu"}, r"expected a built-in profile"),
])
def test_bad_arguments_are_usage_errors(args, kwargs, pattern):
    with pytest.raises(UsageError, match=pattern):
        export(*args, **kwargs)


def test_upsampling_exports_without_recursion():
    """aten::upsample_nearest2d.vec (every diffusers UNet/VAE) once recursed without end."""

    class Up(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.interpolate(x, scale_factor=2.0, mode="nearest")

    x = torch.randn(1, 2, 4, 4)
    result = export(Up(), (x,), target="mps")
    assert "aten::upsample_nearest2d.vec" in result.decomposed
    torch.testing.assert_close(result.module()(x), Up()(x))
