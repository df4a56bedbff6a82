"""Device kernels the vendor's table lists that torch has for CUDA only, written with torch ops.

torch picks some kernels itself for an accelerator (not the program): ``nn.LSTM``'s cell is
``_thnn_fused_lstm_cell`` whenever the input is on CUDA, XPU or a PrivateUse1 device (aten's
RNN.cpp), and torch_npu provides it (Ascend's table lists it, and its backward). torch has only
CUDA kernels for it, so on the emulated npu no kernel could run it — the boxed fallback reached
the CPU, which has none: ``NotImplementedError: Could not run 'aten::_thnn_fused_lstm_cell' with
arguments from the 'CPU' backend`` (pytorch/examples word_language_model and mnist_rnn, found by
the acceptance run on the emulated npu).

``nn.GRU``/``nn.GRUCell`` pick ``_thnn_fused_gru_cell`` the same way (test_modules' GRUCell tests:
"Could not run 'aten::_thnn_fused_gru_cell' with arguments from the 'CPU' backend"). Ascend lists its
forward; torch's derivative of it calls ``_thnn_fused_gru_cell_backward``, which has CUDA kernels only
and which the table does not list, so the backward is registered with it (else no GRU could train on
the device; torch_npu trains GRUs) — the one kernel here beyond the table.

Each kernel here is the CUDA kernel's arithmetic (aten/src/ATen/native/cuda/RNN.cu) written with
torch ops on the device's tensors, registered for PrivateUse1: its pieces run as the device's own
kernels, and autograd is torch's (the op's derivative calls the backward kernel below).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["register", "OPS"]

OPS = ("_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell",
       "_thnn_fused_gru_cell_backward")
_LIB: list[Any] = []  # the registration lives as long as the process (as the device does)


def _lstm_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, cx: torch.Tensor,
               input_bias: torch.Tensor | None = None, hidden_bias: torch.Tensor | None = None):
    """(hy, cy, workspace): workspace holds the activated gates [i, f, g, o] per row, as CUDA's does."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def _lstm_cell_backward(grad_hy: torch.Tensor | None, grad_cy: torch.Tensor | None, cx: torch.Tensor,
                        cy: torch.Tensor, workspace: torch.Tensor, has_bias: bool):
    """(grad_gates, grad_cx, grad_bias), CUDA's lstm_backward: an undefined gradient counts as zeros."""
    i, f, g, o = workspace.chunk(4, 1)
    go = torch.zeros_like(cy) if grad_hy is None else grad_hy
    gc = torch.zeros_like(cy) if grad_cy is None else grad_cy
    tcy = cy.tanh()
    gog = go * tcy * (1 - o) * o
    gcx = go * o * (1 - tcy * tcy) + gc
    gig = gcx * g * (1 - i) * i
    gfg = gcx * cx * (1 - f) * f
    gcg = gcx * i * (1 - g * g)
    grad_gates = torch.cat([gig, gfg, gcg, gog], 1)
    grad_bias = grad_gates.sum(0, keepdim=False) if has_bias else None
    return grad_gates, gcx * f, grad_bias


def _gru_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
              input_bias: torch.Tensor | None = None, hidden_bias: torch.Tensor | None = None):
    """(hy, workspace): workspace holds [r, i, n, hx, hn] per row (hn: the hidden gates' n part, biased),
    as CUDA's gru_cell_forward stores it."""
    ig = input_gates if input_bias is None else input_gates + input_bias
    hg = hidden_gates if hidden_bias is None else hidden_gates + hidden_bias
    ir, ii, in_ = ig.chunk(3, 1)
    hr, hi, hn = hg.chunk(3, 1)
    r = (ir + hr).sigmoid()
    i = (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + i * (hx - n)
    return hy, torch.cat([r, i, n, hx, hn], 1)


def _gru_cell_backward(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool):
    """(grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias), CUDA's
    gru_cell_backward."""
    r, i, n, hx, hn = workspace.chunk(5, 1)
    gig = grad_hy * (hx - n) * (1 - i) * i
    ghx = grad_hy * i
    gin = grad_hy * (1 - i) * (1 - n * n)
    ghn = gin * r
    grg = gin * hn * (1 - r) * r
    grad_input_gates = torch.cat([grg, gig, gin], 1)
    grad_hidden_gates = torch.cat([grg, gig, ghn], 1)
    if has_bias:
        return grad_input_gates, grad_hidden_gates, ghx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)
    empty = grad_hy.new_empty(0)
    return grad_input_gates, grad_hidden_gates, ghx, empty, empty


def register(name: str) -> None:
    """Register the kernels for the PrivateUse1 key (once per process; ``name`` is the device's)."""
    if _LIB:
        return
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - kernels for a backend torch lacks them for
    lib.impl("_thnn_fused_lstm_cell", _lstm_cell, "PrivateUse1")
    lib.impl("_thnn_fused_lstm_cell_backward_impl", _lstm_cell_backward, "PrivateUse1")
    lib.impl("_thnn_fused_gru_cell", _gru_cell, "PrivateUse1")
    lib.impl("_thnn_fused_gru_cell_backward", _gru_cell_backward, "PrivateUse1")
    _LIB.append(lib)
