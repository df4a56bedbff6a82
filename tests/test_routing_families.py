"""Device-selected kernel families and self-decomposing ops: a simulated target's picture has no
host artifacts, and explain() says before anything runs what execution then does.

The sweep runs one training step of every ``torch-adapter coverage`` family on every simulated
target (about a minute on 2 quiet cores) and checks every op call it recorded.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import pytest

import torch_adapter
from torch_adapter.coverage import engine as cov_engine
from torch_adapter.coverage.models import FAMILIES
from torch_adapter.routing import kernel_families as kf
from torch_adapter.routing import ops_table, profiles, self_decomp
from torch_adapter.routing.choose import decide_name
from torch_adapter.routing.decide import Route
from torch_adapter.routing.explain import explain

SIMULATED = ("cuda", "mps", "npu", "xpu", "mtia")
HOST_KERNELS = ("aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward", "aten::_slow_conv2d_forward",
                "aten::_slow_conv2d_backward.output_mask", "aten::mkldnn_convolution",
                "aten::_scaled_dot_product_flash_attention_for_cpu",
                "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def test_the_family_table_names_ops_this_torch_has():
    known = set(ops_table.load_table())
    assert kf.all_ops() <= known, sorted(kf.all_ops() - known)
    assert all(kf.is_host_only(op) for op in HOST_KERNELS if "rnn" in op or "_for_cpu" in op or "slow" in op)


@pytest.mark.parametrize("target", SIMULATED)
@pytest.mark.parametrize("host_op", HOST_KERNELS)
def test_a_host_kernel_is_routed_as_the_targets_member(target, host_op):
    d = explain(host_op, target=target)
    assert not kf.is_host_only(d.op) and d.op != host_op
    assert f"this host ran its own {host_op}" in d.reason and d.via == "device-selected"
    assert d.route is decide_name(d.op, profiles.load_profile(target)).route  # the member's own route


@pytest.mark.parametrize(("target", "op", "member"), [
    ("cuda", "aten::mkldnn_rnn_layer", "aten::_cudnn_rnn"),
    ("mps", "aten::mkldnn_rnn_layer", "aten::_lstm_mps"),
    ("xpu", "aten::mkldnn_rnn_layer", "aten::_thnn_fused_lstm_cell"),
    ("npu", "aten::mkldnn_rnn_layer", "aten::lstm.input"),  # Ascend lists aten::lstm itself
    ("cuda", "aten::_slow_conv2d_forward", "aten::cudnn_convolution"),
    ("mps", "aten::_slow_conv2d_backward.output_mask", "aten::mps_convolution_backward"),
    ("xpu", "aten::_slow_conv2d_forward", "aten::convolution_overrideable"),
    ("cuda", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention"),
    ("mps", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math"),
    ("cuda", "aten::native_batch_norm", "aten::cudnn_batch_norm"),
])
def test_members_per_target(target, op, member):
    d = explain(op, target=target)
    assert d.op == member and d.route in (Route.NATIVE, Route.COMPOSITE)


def test_where_the_host_member_is_every_devices_it_keeps_its_route():
    assert explain("aten::native_batch_norm", target="mps").op == "aten::native_batch_norm"
    d = explain("aten::_slow_conv2d_forward", target="mtia")  # no convolution kernel on mtia at all
    assert d.op == "aten::convolution_overrideable" and d.route is Route.FALLBACK
    assert "only raises" in d.reason  # its CompositeExplicit kernel is a hook, not a composite
    assert explain("aten::mkldnn_rnn_layer", target="cpu").op == "aten::mkldnn_rnn_layer"  # the CPU's own


@pytest.mark.parametrize("op", ["aten::sum.dim_IntList", "aten::fill_.Scalar", "aten::var.correction",
                                "aten::zero_", "aten::cat"])
def test_self_decomposing_ops_fall_back_before_they_run(op):
    mtia = profiles.load_profile("mtia")
    assert self_decomp.calls_itself(op, mtia) is True
    d = explain(op, target="mtia")
    assert d.route is Route.FALLBACK and "calls the op itself" in d.reason


def test_a_working_decomposition_stays_composite():
    mtia = profiles.load_profile("mtia")
    assert self_decomp.calls_itself("aten::native_batch_norm", mtia) is False
    assert explain("aten::native_batch_norm", target="mtia").route is Route.COMPOSITE


def test_the_probe_is_invisible_to_traces_and_sessions():
    def block(probe: bool):
        with torch_adapter.trace(use_observer=False) as log:
            x = torch.ones(3)
            d = explain("aten::var.correction", target="mtia") if probe else None  # probes under the recorder
            y = x + 1
        return {(r.op, r.route, r.calls) for r in log.records()}, d, y

    with torch_adapter.adapted(target="mtia", simulate=True):
        plain, _, _ = block(False)
        self_decomp.calls_itself.cache_clear()
        decide_name.cache_clear()
        probed, d, y = block(True)
    assert d.route is Route.FALLBACK
    assert probed == plain  # the probe's own ops were neither routed nor recorded
    torch.testing.assert_close(y, torch.full((3,), 2.0))


# -- the sweep: every coverage family x every simulated target ---------------------------------
@pytest.fixture(scope="module")
def sweep():
    records = []
    for fam in FAMILIES:
        work, optimizer = cov_engine._prepare(fam)
        for target in SIMULATED:  # as coverage measures a row (foreach as torch picks it for the device)
            spec = cov_engine.TargetSpec(target)
            for group in optimizer.param_groups:
                group["foreach"] = cov_engine._foreach(spec)
            with torch_adapter.adapted(target, simulate=True):
                with torch_adapter.trace(use_observer=False) as log:
                    cov_engine.training_step(work, optimizer)
            row = cov_engine.analyse(log, top=50)  # what the coverage row lists
            records.append((fam.name, target, row, list(log.records())))
    return records


@pytest.mark.slow
def test_no_host_selected_kernel_is_a_fallback_anywhere(sweep):
    for fam, target, row, recs in sweep:
        bad = [r.op for r in recs if kf.is_host_only(r.op)]
        assert not bad, (fam, target, bad)  # not even as native: the target's member is named
        listed = [f.op for f in (*row["top_fallbacks"], *row["nested_fallbacks"]) if kf.is_host_only(f.op)]
        assert not listed and not any(f.host_selected for f in row["top_fallbacks"]), (fam, target, listed)


@pytest.mark.slow
def test_explain_agrees_with_execution_for_every_op_called(sweep):
    disagree = []
    for fam, target, _, recs in sweep:
        profile = profiles.load_profile(target)
        for r in recs:
            if r.calls and decide_name(r.op, profile).route.value != r.route:
                disagree.append((fam, target, r.op, r.route, r.reason[:80]))
    assert not disagree, disagree


def test_export_reports_name_the_targets_member_not_the_hosts():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.conv = nn.Conv2d(3, 4, 3)
            self.lstm = nn.LSTM(4, 4, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.conv(x).flatten(2).transpose(1, 2)  # (N, L, 4)
            h = F.scaled_dot_product_attention(h, h, h)
            return self.lstm(h)[0]

    x = torch.randn(1, 3, 6, 6)
    for target in ("cuda", "npu", "xpu", "mps"):
        result = torch_adapter.export(Mixed().eval(), (x,), target=target)
        rows = [*result.fallbacks, *result.composite, *result.leftovers]
        assert not [r["op"] for r in rows if kf.is_host_only(r["op"])], (target, rows)
        assert not [r["op"] for r in result.fallbacks if r["op"].startswith("prims::")]
