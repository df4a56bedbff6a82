"""register_fallback / register_accelerated / optimize.register: handles, routes, removal."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torch_adapter
from torch_adapter import Route, explain, optimize, register_accelerated, register_fallback
from torch_adapter.errors import RegistrationError, UsageError
from torch_adapter.routing.policy import PolicyWarning
from torch_adapter.routing.trace import trace

ADD_RELU = "aten::_add_relu.Tensor"  # MPS lacks it and it has no decomposition


def _add_relu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._add_relu.Tensor(a, b)


def test_register_fallback_routes_calls_to_the_python_implementation():
    torch_adapter.install(target="mps", simulate=True, fallback="error")
    calls = []

    @register_fallback(ADD_RELU)
    def add_relu(self, other, alpha=1):
        calls.append(self.shape)
        return torch.relu(self + alpha * other)

    a, b = torch.randn(3), torch.randn(3)
    with trace() as log:
        got = _add_relu(a, b)  # "error" policy: only the registered implementation may run
    torch.testing.assert_close(got, torch.relu(a + b))
    assert calls == [torch.Size([3])] and add_relu(a, b).shape == (3,)  # the handle still calls it
    row = next(r for r in log.table() if r["op"] == ADD_RELU)
    assert (row["route"], row["via"], row["bytes_copied"]) == ("yours", "register_fallback", 0)
    assert "your register_fallback implementation runs it on the device" in row["reason"]
    assert {r["op"] for r in log.table() if r["parent"] == ADD_RELU} >= {"aten::relu", "aten::add.Tensor"}
    assert explain(ADD_RELU).via == "register_fallback"
    add_relu.remove()
    assert explain(ADD_RELU).via == "cpu"
    add_relu.remove()  # idempotent


def test_duplicates_name_the_op():
    torch_adapter.install(target="mps", simulate=True)
    register_fallback(ADD_RELU, lambda a, b, alpha=1: a)
    with pytest.raises(RegistrationError, match=r"(?s)register_fallback\('aten::_add_relu\.Tensor'\): expected one "
                                                r"registration per op.*test_routing_registry\.py.*\.remove\(\)"):
        register_fallback(ADD_RELU, lambda a, b, alpha=1: b)


def test_uninstall_removes_every_registration():
    torch_adapter.install(target="mps", simulate=True)
    handle = register_fallback(ADD_RELU, lambda a, b, alpha=1: a)
    torch_adapter.uninstall()
    assert handle.removed
    torch_adapter.install(target="mps", simulate=True)
    assert explain(ADD_RELU).via == "cpu"
    register_fallback(ADD_RELU, lambda a, b, alpha=1: a)  # no duplicate: the old session's is gone


def test_register_accelerated_makes_the_op_native_on_its_target():
    torch_adapter.install(target="mps", simulate=True)
    handle = register_accelerated(ADD_RELU, lambda a, b, alpha=1: torch.clamp_min(a + alpha * b, 0), device="mps")
    register_accelerated(ADD_RELU, lambda a, b, alpha=1: a, device="npu")  # another target: no effect here
    a, b = torch.randn(4), torch.randn(4)
    with trace() as log:
        got = _add_relu(a, b)
    torch.testing.assert_close(got, torch.relu(a + b))
    d = explain(ADD_RELU)
    assert (d.route, d.via) == (Route.NATIVE, "register_accelerated")
    assert log.routes(parent=None)[ADD_RELU] == "native"
    handle.remove()
    assert explain(ADD_RELU).route is Route.FALLBACK


def test_register_fallback_on_a_real_target_without_the_op():
    # _fused_dropout has CUDA kernels only: on the CPU target it has no kernel of its own
    torch_adapter.install(target="cpu")
    register_fallback("aten::_fused_dropout", lambda x, p, generator=None: (x * 2, torch.ones_like(x, dtype=torch.bool)))
    out, mask = torch.ops.aten._fused_dropout(torch.ones(3), 0.5)
    assert out.tolist() == [2.0, 2.0, 2.0] and mask.all()


def test_bad_registrations():
    with pytest.raises(UsageError, match=r"(?s)register_fallback\('aten::nonzero'\): expected an installed adapter"):
        register_fallback("aten::nonzero", lambda x: x)
    torch_adapter.install(target="mps", simulate=True)
    with pytest.raises(RegistrationError, match=r"expected a function implementing the op, got 3 \(int\)"):
        register_fallback(ADD_RELU, 3)
    with pytest.raises(UsageError, match=r"(?s)did you mean aten::nonzero"):
        register_fallback("aten::nonzeroo", lambda x: x)
    with pytest.raises(UsageError, match=r"device=\.\.\.\): expected a target name: cpu, cuda, mps, .*got ''"):
        register_accelerated(ADD_RELU, lambda a, b, alpha=1: a, device="")
    with pytest.raises(UsageError, match=r"(?s)expected a target name: .*npu.*got 'nup' \(did you mean 'npu'\?\)"):
        register_accelerated(ADD_RELU, lambda a, b, alpha=1: a, device="nup")
    with pytest.warns(PolicyWarning, match=r"device='npu'\): the installed target is mps \(simulated on cpu\), so "
                                           r"this kernel changes no route"):
        register_accelerated(ADD_RELU, lambda a, b, alpha=1: a, device="npu")
    with pytest.warns(PolicyWarning, match=r"register_fallback\('aten::mm'\): mps has its own MPS kernel"):
        register_fallback("aten::mm", lambda a, b: a @ b)


def _doubled(module, x):
    return 2 * torch.nn.functional.layer_norm(x, module.normalized_shape, module.weight, module.bias, module.eps)


def test_optimize_replaces_existing_and_new_instances_while_installed():
    old = nn.LayerNorm(4)
    x = torch.randn(2, 4)
    plain = old(x)
    torch_adapter.install(target="mps", simulate=True)
    handle = optimize.register(nn.LayerNorm, _doubled)
    new = nn.LayerNorm(4)
    torch.testing.assert_close(old(x), 2 * plain)
    torch.testing.assert_close(new(x), 2 * plain)
    assert optimize.registered() == ["torch.nn.modules.normalization.LayerNorm"]
    with trace(use_observer=False) as log:  # the recorder files the replacement's ops under it
        new(x)
    row = next(r for r in log.table() if r["op"] == "optimize::torch.nn.modules.normalization.LayerNorm")
    assert row["via"] == "optimize.register" and "_doubled" in row["reason"]
    assert any(r["parent"] == row["op"] for r in log.table())
    with trace() as log:  # the observer: the module call is listed, its ops at their own place
        old(x)
    assert log.routes()["optimize::torch.nn.modules.normalization.LayerNorm"] == "native"
    handle.remove()
    torch.testing.assert_close(old(x), plain)
    assert "forward" not in nn.LayerNorm.__dict__ or nn.LayerNorm.forward is nn.LayerNorm.__dict__["forward"]


def test_optimize_with_a_module_subclass_and_uninstall():
    class Doubled(nn.LayerNorm):
        def forward(self, x):
            return _doubled(self, x)

    original = nn.LayerNorm.forward
    m, x = nn.LayerNorm(4), torch.randn(2, 4)
    torch_adapter.install(target="cpu")
    optimize.register(nn.LayerNorm, Doubled)
    torch.testing.assert_close(m(x), 2 * nn.functional.layer_norm(x, (4,)), atol=1e-6, rtol=1e-6)
    torch_adapter.uninstall()
    assert nn.LayerNorm.forward is original


def test_optimize_bad_input():
    torch_adapter.install(target="cpu")
    with pytest.raises(RegistrationError, match=r"expected an nn\.Module subclass.*got 3 \(int\)"):
        optimize.register(3, _doubled)  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match=r"(?s)expected a function fn\(module, \*args, \*\*kwargs\).*LayerNorm"):
        optimize.register(nn.LayerNorm, nn.LayerNorm(3))
    optimize.register(nn.LayerNorm, _doubled)
    with pytest.raises(RegistrationError, match=r"torch\.nn\.modules\.normalization\.LayerNorm.*one registration"):
        optimize.register(nn.LayerNorm, _doubled)
