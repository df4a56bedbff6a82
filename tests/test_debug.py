"""torch_adapter.debug: the first op that produced a NaN/Inf is named (op, route, module path,
user line), forward and backward; CPU compare catches a route that computes something else."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import torch_adapter
from torch_adapter.tools import tool_mode as _tool_mode, debug
from torch_adapter.core.torch_private import dispatch_mode_stack
from torch_adapter.errors import AdapterError, NumericsError, UsageError
from torch_adapter.routing.trace import trace


@pytest.fixture(autouse=True)
def _checks_off():
    yield
    debug.disable_nan_check()
    debug.disable_cpu_compare()


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(self.proj(x))  # LOG-LINE: negative inputs -> NaN


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attentions = nn.ModuleList([Attention()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attentions[0](x)


class UNetish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.down_blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.down_blocks:
            x = block(x)
        return x


def _line(marker: str) -> int:
    with open(__file__) as fh:
        return next(i for i, line in enumerate(fh, 1) if marker in line and "_line(" not in line)


def test_nan_names_op_route_module_path_and_line():
    unet = UNetish()
    x = torch.randn(3, 4)
    debug.enable_nan_check()
    with pytest.raises(NumericsError, match=r"(?s)^aten::log \(forward in unet\.down_blocks\.0\.attentions\.0\) "
                                                r"from `torch\.log\(self\.proj\(x\)\)` at "
                                            r".*test_debug\.py:\d+: expected finite values from inputs without NaN, "
                                            r"got \d+ NaN among 12 elements.*Why: it ran by route native \(cpu has its "
                                            r"own CPU kernel\).*first op that produced a NaN.*Fix: "):
        unet(x)
    f = debug.findings()[-1]
    assert (f.op, f.route, f.module, f.phase, f.kind) == ("aten::log", "native", "unet.down_blocks.0.attentions.0",
                                                          "forward", "nan")
    assert f.site["file"] == __file__ and f.site["line"] == _line("LOG-LINE")
    assert isinstance(NumericsError("x"), AdapterError) and isinstance(NumericsError("x"), FloatingPointError)


def test_route_comes_from_the_simulated_target():
    torch_adapter.install(target="mps", simulate=True)
    debug.enable_nan_check()
    with pytest.raises(NumericsError, match=r"(?s)^aten::logit_ \(forward\).*route composite \(no MPS kernel; "
                                            r"decomposes via torch._decomp"):
        torch.tensor([0.5, 2.0]).logit_()  # logit of 2 is NaN
    assert debug.findings()[-1].route == "composite"


def test_backward_op_is_named_with_its_autograd_node():
    y = torch.tensor([0.0, 4.0], requires_grad=True)
    debug.enable_nan_check()
    with pytest.raises(NumericsError, match=r"(?s)^aten::\w+(\.\w+)? \(backward of SqrtBackward0\) "
                                            r"from `y\.sqrt\(\)\.sum\(\)\.backward\(\)` at "
                                            r".*test_debug\.py.*produced an Inf"):
        y.sqrt().sum().backward()  # BACKWARD-LINE
    assert debug.findings()[-1].site["line"] == _line("BACKWARD-LINE")


def test_in_place_ops_and_deliberate_infinities():
    debug.enable_nan_check()
    mask = torch.full((3, 3), float("-inf")).triu(1)  # -inf on purpose: not reported
    scores = torch.softmax(torch.randn(3, 3) + mask, dim=-1).masked_fill(mask == 0, 0.0)
    assert torch.isfinite(scores).all()
    x = torch.tensor([1.0, -1.0])
    with pytest.raises(NumericsError, match=r"^aten::log_ \(forward\)"):
        x.log_()


def test_warn_mode_names_each_new_producer_once_and_goes_on():
    debug.enable_nan_check(mode="warn")
    x = torch.tensor([-1.0, 2.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            y = torch.log(x) + torch.sqrt(x)
    messages = [str(w.message) for w in caught if issubclass(w.category, debug.NumericsWarning)]
    assert len(messages) == 2 and messages[0].startswith("aten::log ") and messages[1].startswith("aten::sqrt ")
    assert torch.isnan(y).any()  # the program ran on


def test_stays_on_across_calls_and_comes_off_from_under_another_mode():
    debug.enable_nan_check()
    assert any(type(m).__name__ == "ToolMode" for m in dispatch_mode_stack())
    with trace(use_observer=False) as log:  # a recorder mode pushed above ours
        debug.disable_nan_check()
        torch.log(torch.tensor([-1.0]))  # no longer checked, still recorded
    assert "aten::log" in log.routes()
    assert dispatch_mode_stack() == []


def test_uninstall_turns_the_checks_off():
    torch_adapter.install(target="cpu")
    debug.enable_nan_check()
    debug.enable_cpu_compare()
    torch_adapter.uninstall()
    assert not _tool_mode.enabled("nan_check") and not _tool_mode.enabled("cpu_compare")
    assert dispatch_mode_stack() == []
    torch.log(torch.tensor([-1.0]))


def test_cpu_compare_catches_a_route_that_computes_something_else():
    torch_adapter.install(target="mps", simulate=True)
    torch_adapter.register_fallback("aten::heaviside", lambda x, values: (x > 0).to(x.dtype) * 2)  # wrong
    debug.enable_cpu_compare(routes=("composite", "yours"))
    x = torch.randn(4, 4)
    torch.special.log_ndtr(x)  # composite by decomposition: agrees within float32 tolerance
    with pytest.raises(NumericsError, match=r"(?s)^aten::heaviside \(forward\) from "
                                            r"`torch\.heaviside\(x, torch\.zeros\(\(\)\)\)` at .*: expected the same result as the "
                                            r"CPU's plain aten kernel, got output 0 \(torch.float32, shape \[4, 4\]\): "
                                            r"\d+ of 16 elements differ; the largest \|difference\| is 1.*Why: on the "
                                            r"target it "
                                            r"ran by route yours \(no MPS kernel; your register_fallback "
                                            r"implementation runs it on the device \(nothing copied\)\)"):
        torch.heaviside(x, torch.zeros(()))
    assert debug.findings()[-1].kind == "mismatch"


def test_cpu_compare_ops_filter_and_exact_tolerance():
    torch_adapter.install(target="mps", simulate=True)
    debug.enable_cpu_compare(atol=0, rtol=0, ops=["aten::heaviside"])
    x = torch.randn(64)
    torch.special.log_ndtr(x * 10)  # not selected
    torch.heaviside(x, torch.zeros(()))  # its decomposition is exact
    debug.enable_cpu_compare(atol=0, rtol=0, ops=["aten::special_log_ndtr"], mode="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.special.log_ndtr(torch.linspace(-30, 5, 256))
    assert [w for w in caught if "special_log_ndtr" in str(w.message) and "atol=0, rtol=0" in str(w.message)]


@pytest.mark.parametrize(("call", "kwargs", "pattern"), [
    (debug.enable_nan_check, {"mode": "loud"},
     r"enable_nan_check\(mode=...\): expected mode='raise' or mode='warn', got 'loud'"),
    (debug.enable_cpu_compare, {"mode": "x"}, r"enable_cpu_compare\(mode=...\): expected mode='raise' or"),
    (debug.enable_cpu_compare, {"atol": -1}, r"expected atol=None or a number >= 0, got -1 \(int\)"),
    (debug.enable_cpu_compare, {"rtol": "tight"}, r"expected rtol=None or a number >= 0, got 'tight'"),
    (debug.enable_cpu_compare, {"ops": ["aten::heavyside"]},
     r"(?s)expected an op this torch knows.*did you mean aten::heaviside"),
    (debug.enable_cpu_compare, {"ops": ["aten::zz*"]},
     r"expected patterns that match ops of this torch, got 'aten::zz\*'"),
    (debug.enable_cpu_compare, {"ops": 3}, r"expected op names or globs"),
    (debug.enable_cpu_compare, {"routes": ["slow"]}, r"routes=...\): expected a non-empty subset of \('native'"),
])
def test_bad_arguments_are_usage_errors(call, kwargs, pattern):
    with pytest.raises(UsageError, match=pattern):
        call(**kwargs)
    assert not _tool_mode.enabled("nan_check") and not _tool_mode.enabled("cpu_compare")


def test_a_failing_tool_reports_itself_and_the_op_still_runs():
    class Broken:
        def before(self, func, args, kwargs):
            return None

        def after(self, func, args, kwargs, out, state):
            raise KeyError("observer bug")

    _tool_mode.enable("broken", Broken(), track_modules=False)
    try:
        with pytest.warns(_tool_mode.ToolWarning,
                          match=r"the broken tool failed on aten::ones \(KeyError: .observer bug.\) and is now off"):
            y = torch.ones(2) + torch.ones(2)
        assert y.tolist() == [2.0, 2.0] and not _tool_mode.enabled("broken")
    finally:
        _tool_mode.disable("broken")
    assert dispatch_mode_stack() == []
