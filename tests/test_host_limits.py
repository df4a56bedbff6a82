"""Ops torch refuses on the host device, answered by the adapter (redirect/host_limits.py; issue 35,
item 5): FlexAttention's backward, which torch refuses on the CPU — where the CPU target's and every
simulated target's "cuda" tensors live — runs as torch's exact dense forward and backward, says what it
costs, is in the migration log; under ``torch.compile(fullgraph=True)`` the step stops with the
adapter's error. Real runs: the adapter installed in this process, and ``torch-adapter run --report``
in a fresh one."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_adapter
from torch_adapter.errors import UnsupportedCudaFeature
from torch_adapter.redirect.host_limits import HostLimitWarning

flex = pytest.importorskip("torch.nn.attention.flex_attention")

L, D = 64, 16


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def relative(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.01


def _inputs(device):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, L, D, generator=g).to(device).requires_grad_() for _ in range(3)]


def _reference(q, k, v):
    """Attention written out: relative bias, causal mask, softmax, on plain tensors."""
    s = (q @ k.transpose(-2, -1)) / D ** 0.5
    i = torch.arange(L)
    s = s + (i[:, None] - i[None, :]) * 0.01
    s = s.masked_fill(~(i[:, None] >= i[None, :]), float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("target", ["cpu", "mps"])
def test_flex_attention_backward_runs_exactly_on_the_host(target):
    with torch_adapter.adapted(target, simulate=target != "cpu") as session:
        q, k, v = _inputs("cuda")
        block_mask = flex.create_block_mask(causal, 1, 2, L, L, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = flex.flex_attention(q, k, v, score_mod=relative, block_mask=block_mask)
            out.sum().backward()
        rows = [e for e in session.redirect_log.entries() if e.kind == "host_limit"]
    ours = [w for w in caught if issubclass(w.category, HostLimitWarning)]
    assert len(ours) == 1 and "TA-X015" in str(ours[0].message) and "L×S score matrix" in str(ours[0].message)
    assert ours[0].filename == __file__  # the warning points at the program's line
    assert len(rows) == 1 and rows[0].code == "TA-X015" and rows[0].cls == "changed" and rows[0].file == __file__
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = _reference(q2, k2, v2)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for got, want in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_uninstalled_torch_refuses_again():
    """The answer is the session's: after it, torch's own check is back, unchanged."""
    with torch_adapter.adapted("cpu"):
        pass
    q, k, v = _inputs("cpu")
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        flex.flex_attention(q, k, v)


def test_without_grad_nothing_is_logged_or_warned():
    with torch_adapter.adapted("cpu") as session:
        q, k, v = (t.detach() for t in _inputs("cuda"))
        with warnings.catch_warnings():
            warnings.simplefilter("error", HostLimitWarning)
            flex.flex_attention(q, k, v)
        assert not [e for e in session.redirect_log.entries() if e.kind == "host_limit"]


def test_fullgraph_compile_stops_at_the_step_with_what_to_do():
    torch._dynamo.reset()
    try:
        with torch_adapter.adapted("cpu"):
            q, k, v = _inputs("cuda")
            compiled = torch.compile(flex.flex_attention, fullgraph=True)
            with pytest.raises(Exception) as raised:
                compiled(q, k, v)
        text = str(raised.value)
        assert UnsupportedCudaFeature.__name__ in text or isinstance(raised.value, UnsupportedCudaFeature)
        assert "inductor has no CPU kernel for FlexAttention's backward" in text
        assert "Fix: call the attention outside the compiled region" in text
    finally:
        torch._dynamo.reset()


SCRIPT = """\
import torch
from torch.nn.attention.flex_attention import flex_attention
q, k, v = (torch.randn(1, 2, 16, 8, device="cuda", requires_grad=True) for _ in range(3))
out = flex_attention(q, k, v)
out.sum().backward()
print("GRAD", float(q.grad.abs().sum()) > 0)
"""


def test_run_report_observes_flex_attention(tmp_path, cli):
    """Under `run --report` torch refused the higher-order op ("no rule registered for HigherOrderOperator
    flex_attention and mode Recorder") and a TorchScript primitive it asks (prim::device) was reported as a
    CPU fallback that fails: the report broke a program that runs without it."""
    script = tmp_path / "attn.py"
    script.write_text(SCRIPT)
    p = cli("run", "--report", str(script))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "GRAD True" in p.stdout
    assert "HigherOrderOperator" not in p.stderr and "prim::device" not in p.stderr
    assert "0 CPU fallback op calls" in p.stderr
    assert "attn.py:4: flex_attention(...) backward on the CPU ×1" in p.stderr
