"""Fallback policy: configure(fallback=..., force_cpu=..., deny=...), effective at once."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import torch_adapter
from torch_adapter.errors import FallbackError, UsageError
from torch_adapter.routing.policy import FallbackWarning, PolicyWarning
from torch_adapter.routing.trace import trace


def _eigh() -> torch.Tensor:
    x = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    return torch.linalg.eigh(x @ x.T)[0]


def test_warn_carries_running_counts_and_is_never_silenced():
    torch_adapter.install(target="mps", simulate=True, fallback="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(9):
            _eigh()
    msgs = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert [m.split(": call ")[1].split(" ")[0] for m in msgs] == ["1", "2", "4", "8"]
    # the op, then the user's call that reached it (the line inside _eigh), then what happened
    assert msgs[0].startswith("aten::_linalg_eigh (from `torch.linalg.eigh(x @ x.T)`) ran on the CPU on mps "
                              "(simulated on cpu)"), msgs[0]
    assert "silence with `torch_adapter.configure(fallback='allow')`" in msgs[0]  # plain Python: the option
    assert re.search(r"so far, \d+(\.\d)? (B|KiB|MiB) copied", msgs[0]), msgs[0]  # binary units, as the pill
    assert "register_fallback('aten::_linalg_eigh')" in msgs[0]
    assert {w.filename for w in caught} == {__file__}  # points at the user's line


def test_error_names_op_target_reason_and_ways_out():
    torch_adapter.install(target="mps", simulate=True, fallback="error")
    with pytest.raises(FallbackError, match=r"(?s)aten::_linalg_eigh on mps \(simulated on cpu\), from "
                                            r"`torch\.linalg\.eigh\(x @ x\.T\)` at .*test_routing_policy\.py:\d+: "
                                            r"expected an op the target runs natively.*no MPS kernel and no "
                                            r"decomposition.*fallback policy is \"error\".*Fix: to let "
                                            r"`torch\.linalg\.eigh\(x @ x\.T\)` run aten::_linalg_eigh on the CPU, "
                                            r"`torch_adapter\.configure\(fallback='warn'\)`.*"
                                            r"register_fallback\('aten::_linalg_eigh'\)"):
        _eigh()
    torch.heaviside(torch.randn(3), torch.tensor(0.0))  # composite ops are fine under "error"


def test_configure_takes_effect_at_once():
    torch_adapter.install(target="mps", simulate=True)
    _eigh()
    torch_adapter.configure(fallback="error")
    with pytest.raises(FallbackError, match="aten::_linalg_eigh"):
        _eigh()
    torch_adapter.configure(fallback="allow")
    _eigh()


def test_deny_errors_even_when_fallbacks_are_allowed():
    torch_adapter.install(target="mps", simulate=True, deny=["aten::_linalg_eigh"])
    with pytest.raises(FallbackError, match=r"(?s)it is in configure\(deny=\.\.\.\).*remove 'aten::_linalg_eigh' from deny"):
        _eigh()


def test_deny_on_ops_that_never_fall_back_warns():
    torch_adapter.install(target="mps", simulate=True)
    with pytest.warns(PolicyWarning, match=r"deny=\['aten::nonzero'\]\): aten::nonzero never runs on the CPU on mps"):
        torch_adapter.configure(deny=["aten::nonzero"])


def test_force_cpu_on_a_native_op_warns_and_runs_it_on_the_cpu():
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    torch_adapter.install(target="mps", simulate=True)
    with pytest.warns(PolicyWarning, match=r"aten::mm has a native MPS kernel on mps; forcing it to the CPU adds copies"):
        torch_adapter.configure(force_cpu=["aten::mm"])
    with trace() as log:
        got = a @ b
    torch.testing.assert_close(got, torch.mm(a, b), rtol=0, atol=0)
    row = next(r for r in log.table() if r["op"] == "aten::mm")
    assert row["route"] == "fallback" and row["bytes_to_cpu"] == (20 + 30) * 4 and row["bytes_from_cpu"] == 24 * 4
    assert "forced to the CPU by configure(force_cpu=...)" in row["reason"]


def test_force_cpu_packet_name_covers_overloads():
    session = torch_adapter.install(target="mps", simulate=True)
    torch_adapter.configure(force_cpu=["aten::heaviside"])
    assert {"aten::heaviside", "aten::heaviside.out"} == set(session.routing.policy.force_cpu)


def test_unknown_and_invalid_policy_ops():
    torch_adapter.install(target="mps", simulate=True)
    with pytest.raises(UsageError, match=r"(?s)configure\(force_cpu=\['aten::nonzer'\]\).*did you mean aten::nonzero"):
        torch_adapter.configure(force_cpu=["aten::nonzer"])
    assert torch_adapter.current().config.force_cpu == ()  # a rejected configure() changes nothing
    with pytest.raises(UsageError, match=r"(?s)deny=\.\.\.\): expected op names.*got 7 \(int\)"):
        torch_adapter.configure(deny=[7])
    with pytest.raises(UsageError, match=r"(?s)force_cpu=\['aten::t'\]\): expected ops that compute.*alias"):
        torch_adapter.configure(force_cpu=["aten::t"])


def test_policy_on_the_host_target_attaches_the_engine():
    with pytest.warns(PolicyWarning, match="aten::mm has a native CPU kernel on cpu; forcing it to the CPU changes"):
        session = torch_adapter.install(target="cpu", force_cpu=["aten::mm"])
    assert session.routing is not None and "aten::mm" in session.routing.overrides
    a = torch.randn(3, 3)
    torch.testing.assert_close(a @ a, torch.mm(a, a))  # the engine calls the same kernel
    torch_adapter.uninstall()
    assert not repr(torch.library.get_kernel("aten::mm", "CPU")).startswith("SafeKernelFunction(debug='Python")
