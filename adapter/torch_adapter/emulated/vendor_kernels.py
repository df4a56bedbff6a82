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

SyncBatchNorm's kernels (``batch_norm_stats``, ``batch_norm_gather_stats_with_counts``,
``batch_norm_elemt``, ``batch_norm_backward_reduce``, ``batch_norm_backward_elemt``) have CUDA kernels
only (aten/src/ATen/native/cuda/Normalization.cu); Ascend lists all five, and SyncBatchNorm calls them on
any device that is not the CPU (test_nn's test_sync_batchnorm_accuracy: "Could not run
'aten::batch_norm_stats' with arguments from the 'CPU' backend"). Their statistics are in float32 for
float16/bfloat16 inputs, as CUDA's accumulate type.

Each kernel here is the CUDA kernel's arithmetic (aten/src/ATen/native/cuda/RNN.cu) written with
torch ops on the device's tensors, registered for PrivateUse1: its pieces run as the device's own
kernels, and autograd is torch's (the op's derivative calls the backward kernel below).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["register", "OPS"]

OPS = ("_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell",
       "_thnn_fused_gru_cell_backward", "batch_norm_stats", "batch_norm_gather_stats_with_counts",
       "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt")
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


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def _channel_shape(x: torch.Tensor) -> list[int]:
    return [1, -1] + [1] * (x.dim() - 2)


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [d for d in range(x.dim()) if d != 1]


def _bn_stats(input: torch.Tensor, eps: float):
    """(mean, invstd) per channel (dim 1), biased variance, in the accumulate type."""
    x = input.to(_acc(input))
    var, mean = torch.var_mean(x, _reduce_dims(x), correction=0)
    return mean, (var + eps).rsqrt()


def _bn_gather_stats_with_counts(input: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                                 running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                                 momentum: float, eps: float, counts: torch.Tensor):
    """The global (mean, invstd) from per-replica ones ([world, C]) and counts ([world]); updates the
    running statistics in place with the unbiased variance, as CUDA's kernel."""
    c = counts.to(mean.dtype).reshape(-1, 1)
    n = c.sum()
    gmean = (c * mean).sum(0) / n
    var_i = invstd.reciprocal().square() - eps
    var_n = (c * (var_i + (mean - gmean).square())).sum(0)
    ginvstd = (var_n / n + eps).rsqrt()
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(gmean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var_n / (n - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return gmean, ginvstd


def _bn_elemt(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, mean: torch.Tensor,
              invstd: torch.Tensor, eps: float):
    shape = _channel_shape(input)
    y = (input.to(mean.dtype) - mean.view(shape)) * invstd.view(shape)
    if weight is not None:
        y = y * weight.to(mean.dtype).view(shape)
    if bias is not None:
        y = y + bias.to(mean.dtype).view(shape)
    return y.to(input.dtype).contiguous(memory_format=_memory_format(input))


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous():
        return torch.channels_last_3d
    return torch.contiguous_format


def _bn_elemt_out(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, mean: torch.Tensor,
                  invstd: torch.Tensor, eps: float, *, out: torch.Tensor):
    y = _bn_elemt(input, weight, bias, mean, invstd, eps)
    out.resize_(y.shape)
    return out.copy_(y)


def _bn_backward_reduce(grad_out: torch.Tensor, input: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                        weight: torch.Tensor | None, input_g: bool, weight_g: bool, bias_g: bool):
    """(sum_dy, sum_dy_xmu, grad_weight, grad_bias); the last two empty where not asked for."""
    shape, dims, acc = _channel_shape(input), _reduce_dims(input), mean.dtype
    dy = grad_out.to(acc)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (input.to(acc) - mean.view(shape))).sum(dims)
    wdt = weight.dtype if weight is not None else input.dtype
    grad_weight = (sum_dy_xmu * invstd).to(wdt) if weight_g else input.new_empty(0)
    grad_bias = sum_dy.to(wdt) if bias_g else input.new_empty(0)
    if not input_g:
        sum_dy, sum_dy_xmu = input.new_empty(0, dtype=acc), input.new_empty(0, dtype=acc)
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def _bn_backward_elemt(grad_out: torch.Tensor, input: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                       weight: torch.Tensor | None, sum_dy: torch.Tensor, sum_dy_xmu: torch.Tensor,
                       count: torch.Tensor):
    shape, acc = _channel_shape(input), mean.dtype
    norm = 1.0 / count.to(acc).sum()
    mean_dy = (sum_dy * norm).view(shape)
    mean_dy_xmu = (sum_dy_xmu * norm).view(shape)
    ist = invstd.view(shape)
    xmu = input.to(acc) - mean.view(shape)
    g = (grad_out.to(acc) - mean_dy - xmu * ist * ist * mean_dy_xmu) * ist
    if weight is not None:
        g = g * weight.to(acc).view(shape)
    return g.to(input.dtype).contiguous(memory_format=_memory_format(input))


def register(name: str) -> None:
    """Register the kernels for the PrivateUse1 key (once per process; ``name`` is the device's)."""
    if _LIB:
        return
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - kernels for a backend torch lacks them for
    lib.impl("_thnn_fused_lstm_cell", _lstm_cell, "PrivateUse1")
    lib.impl("_thnn_fused_lstm_cell_backward_impl", _lstm_cell_backward, "PrivateUse1")
    lib.impl("_thnn_fused_gru_cell", _gru_cell, "PrivateUse1")
    lib.impl("_thnn_fused_gru_cell_backward", _gru_cell_backward, "PrivateUse1")
    lib.impl("batch_norm_stats", _bn_stats, "PrivateUse1")
    lib.impl("batch_norm_gather_stats_with_counts", _bn_gather_stats_with_counts, "PrivateUse1")
    lib.impl("batch_norm_elemt", _bn_elemt, "PrivateUse1")
    lib.impl("batch_norm_elemt.out", _bn_elemt_out, "PrivateUse1")
    lib.impl("batch_norm_backward_reduce", _bn_backward_reduce, "PrivateUse1")
    lib.impl("batch_norm_backward_elemt", _bn_backward_elemt, "PrivateUse1")
    _LIB.append(lib)
