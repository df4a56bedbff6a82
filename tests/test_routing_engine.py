"""The routing engine really executes routes: models under simulated mps and the host target
give plain results (forward and backward), with the routes, pieces and bytes recorded."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_adapter
from torch_adapter import Route
from torch_adapter.routing.trace import trace


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ln, self.qkv, self.out = nn.LayerNorm(16), nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, n, 3, 2, 8).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return x + self.out(a.transpose(1, 2).reshape(b, n, 16))


class Lacking(nn.Module):
    """Ops MPS lacks: with a decomposition (heaviside, take) and without (eigh, pdist)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        gate = torch.heaviside(h.detach(), torch.tensor(0.5))
        picked = torch.take(h, torch.tensor([0, 3, 7]))
        vals, vecs = torch.linalg.eigh(h.T @ h + torch.eye(6))
        return (h * gate).sum() + picked.sum() + vals.sum() + vecs.abs().sum() + torch.pdist(h).sum()


def step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    out = model(x)
    (out.float() ** 2).mean().backward()
    return out.detach(), [p.grad.detach().clone() for p in model.parameters()]


MODELS = {"cnn": (cnn, (2, 3, 16, 16)), "attention": (Attention, (2, 5, 16)), "lacking": (Lacking, (4, 6))}


def _plain_and_traced(name: str, use_observer: bool | None = None, **install: object):
    make, shape = MODELS[name]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    plain = step(make(), x)
    with torch_adapter.adapted(**install) as session:
        model = make()
        with trace(use_observer=use_observer) as log:
            routed = step(model, x)
    return plain, routed, log, session


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("install", [{"target": "mps", "simulate": True}, {"target": "cpu"}], ids=["mps", "host"])
def test_models_match_plain_forward_and_backward(name, install):
    (p_out, p_grads), (r_out, r_grads), log, _ = _plain_and_traced(name, **install)
    torch.testing.assert_close(r_out, p_out, rtol=0, atol=0)
    for a, b in zip(r_grads, p_grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert sum(log.summary().values()) > 10


@pytest.mark.parametrize("use_observer", [None, False], ids=["observer", "recorder"])
def test_cnn_routes_on_simulated_mps(use_observer):
    *_, log, _ = _plain_and_traced("cnn", use_observer, target="mps", simulate=True)
    routes = log.routes()
    assert routes["aten::convolution"] == "composite"  # its CompositeExplicit kernel picks the backend
    assert routes["aten::convolution_backward"] == "composite"
    assert routes["aten::native_batch_norm"] == "native" and routes["aten::native_batch_norm_backward"] == "native"
    assert routes["aten::max_pool2d_with_indices"] == "native"
    assert routes["aten::t"] == "native" and routes["aten::clone"] == "composite"
    assert log.summary()["fallback"] == 0 and log.target == "mps" and log.simulated
    if log.meta["source"].startswith("observer"):  # CompositeImplicit ops show, with their pieces
        assert log.routes(parent=None)["aten::conv2d"] == "composite"
        assert log.routes(parent="aten::conv2d")["aten::convolution"] == "composite"


def test_attention_is_routed_as_the_targets_own_kernel():
    # the host's _scaled_dot_product_flash_attention_for_cpu runs; mps would take its math path
    *_, log, _ = _plain_and_traced("attention", target="mps", simulate=True)
    rows = {r["op"]: r for r in log.table()}
    assert not any("_for_cpu" in op for op in rows)
    fwd = rows["aten::_scaled_dot_product_attention_math"]
    assert fwd["route"] == "composite"
    assert sum(r.calls for r in log.records() if r.op == fwd["op"]) == 2  # forward, and backward through it
    assert "this host ran its own aten::_scaled_dot_product_flash_attention_for_cpu" in fwd["reason"]
    assert fwd["bytes_copied"] == 0


def test_ops_mps_lacks_route_and_pieces():
    *_, log, session = _plain_and_traced("lacking", target="mps", simulate=True)
    routes = log.routes()
    assert routes["aten::heaviside"] == "composite" and routes["aten::take"] == "composite"
    assert routes["aten::_linalg_eigh"] == "fallback" and routes["aten::_pdist_forward"] == "fallback"
    if log.meta["source"].startswith("observer"):  # CompositeImplicit linalg_eigh, with its pieces
        assert routes["aten::linalg_eigh"] == "composite"
        assert log.routes(parent="aten::linalg_eigh")["aten::_linalg_eigh"] == "fallback"
    pieces = {r.op for r in log.records() if r.parent == "aten::take"}
    assert "aten::index.Tensor" in pieces  # take decomposes into indexing, each piece routed again
    eigh = next(r for r in log.records() if r.op == "aten::_linalg_eigh")
    assert eigh.bytes_to_cpu == 6 * 6 * 4 and eigh.bytes_from_cpu == (6 + 36) * 4
    # the session-wide log keeps what the engine executed, beyond this trace
    assert session.routing is None  # adapted() closed it
    assert log.summary()["fallback"] >= 3


def test_composite_pieces_are_routed_again():
    x = torch.rand(5)
    with torch_adapter.adapted(target="mps", simulate=True):
        with trace() as log:
            y = torch.special.log_ndtr(x)
            z = torch.special.ndtri(x)  # its decomposition calls prims.ndtri, which calls it back
    torch.testing.assert_close(y, torch.special.log_ndtr(x))  # a decomposition: equal within float32 tolerance
    torch.testing.assert_close(z, torch.special.ndtri(x))
    pieces = {r.op: r.route for r in log.records() if r.parent == "aten::special_log_ndtr"}
    assert pieces["aten::erfc"] == "native" and pieces["aten::special_erfcx"] == "native"
    ndtri = next(r for r in log.records() if r.op == "aten::special_ndtri")
    assert ndtri.route == "fallback" and "calls the op itself" in ndtri.reason  # known before it runs


def test_in_place_and_out_variants_on_views():
    base, other = torch.randn(4, 5), torch.randn(3, 5)
    expected = base.clone()
    torch.ops.aten._add_relu_.Tensor(expected[1:], other)
    expected_h = torch.heaviside(base, torch.tensor(0.0))
    with torch_adapter.adapted(target="mps", simulate=True):
        b = base.clone()
        view = b[1:]
        ret = torch.ops.aten._add_relu_.Tensor(view, other)  # fallback, in place, on a view
        assert ret is view
        torch.testing.assert_close(b, expected, rtol=0, atol=0)
        h = base.clone()
        assert h.heaviside_(torch.tensor(0.0)) is h  # composite, in place
        torch.testing.assert_close(h, expected_h)
        out = torch.empty(0)
        res = torch.take(base, torch.tensor([1, 2]), out=out)  # composite out= variant, resized
        assert res is out and out.tolist() == base.flatten()[1:3].tolist()
        out2 = torch.empty(2)
        torch.ops.aten._add_relu.out(base[0, :2], other[0, :2], out=out2)  # fallback out= variant
        torch.testing.assert_close(out2, torch.relu(base[0, :2] + other[0, :2]))


def test_declined_decomposition_runs_on_the_cpu():
    x = torch.randn(1, 2, 5, 5, 5)
    expected = F.adaptive_max_pool3d(x, (2, 2, 2))
    with torch_adapter.adapted(target="mps", simulate=True):
        with trace() as log:
            got = F.adaptive_max_pool3d(x, (2, 2, 2))  # not evenly divisible: the decomp declines
            F.adaptive_max_pool3d(x, (1, 1, 1))  # global pooling: the decomp handles it
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    calls = {(r.op, r.route): r.calls for r in log.records() if r.parent is None}
    assert calls[("aten::adaptive_max_pool3d", "fallback")] == 1 and calls[("aten::adaptive_max_pool3d", "composite")] == 1
    reason = next(r.reason for r in log.records() if r.route == "fallback" and r.op == "aten::adaptive_max_pool3d")
    assert "returned NotImplemented" in reason


def test_only_needed_ops_are_overridden_and_uninstall_restores_kernels():
    before = {op: repr(torch.library.get_kernel(op, "CPU")) for op in ("aten::mm", "aten::heaviside", "aten::_linalg_eigh")}
    session = torch_adapter.install(target="mps", simulate=True)
    engine = session.routing
    assert "aten::heaviside" in engine.overrides and "aten::_linalg_eigh" in engine.overrides
    assert "aten::mm" not in engine.overrides and "aten::clone" not in engine.overrides
    assert repr(torch.library.get_kernel("aten::mm", "CPU")) == before["aten::mm"]  # native ops stay in C++
    assert repr(torch.library.get_kernel("aten::heaviside", "CPU")) != before["aten::heaviside"]
    assert 100 < len(engine.overrides) < 400
    torch_adapter.uninstall()
    assert {op: repr(torch.library.get_kernel(op, "CPU")) for op in before} == before


def test_session_log_counts_engine_routes_without_trace():
    with torch_adapter.adapted(target="mps", simulate=True) as session:
        x = torch.randn(3, 3)
        for _ in range(3):
            torch.linalg.eigh(x @ x.T)
        summary = session.routing.log.summary()
    assert summary["fallback"] == 3 and summary["native"] == 0  # native ops are not watched without trace()


@pytest.mark.parametrize("use_observer", [None, False], ids=["observer", "recorder"])
def test_host_target_needs_no_engine(use_observer):
    with torch_adapter.adapted(target="cpu") as session:
        assert session.routing is None
        with trace(use_observer=use_observer) as log:
            torch.linalg.eigh(torch.eye(3))
            torch.einsum("ij,jk->ik", torch.eye(3), torch.eye(3))
    routes = log.routes()
    assert routes["aten::_linalg_eigh"] == Route.NATIVE.value
    assert not log.simulated and log.target == "cpu"
    if log.meta["source"] == "observer":  # CompositeImplicit ops show, with their pieces under them
        assert routes["aten::einsum"] == "composite" and routes["aten::linalg_eigh"] == "composite"
        assert any(r.parent == "aten::einsum" and r.op == "aten::bmm" for r in log.records())


def test_nested_recorder_trace_inside_an_observer_trace_keeps_fallback_counts():
    torch_adapter.install(target="mps", simulate=True)
    x = torch.randn(8, 8)
    with torch_adapter.trace() as outer:
        with torch_adapter.trace(use_observer=False) as inner:
            torch.linalg.eigh(x @ x.T)
    assert inner.summary()["fallback"] >= 1
    rows = [r for r in outer.table() if r["op"] == "aten::_linalg_eigh"]
    assert rows and sum(r["calls"] for r in rows) == 1 and rows[0]["route"] == "fallback"
