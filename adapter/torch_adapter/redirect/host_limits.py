"""Ops torch itself refuses on the host device, answered where torch has an exact way to run them.

On the CPU target (and every simulated one: their tensors live on the CPU) the program's "cuda"
tensors are CPU tensors, so a check torch makes only for the CPU refuses code that ran on the GPU:

- **FlexAttention's backward.** ``flex_attention`` raises ``NotImplementedError: FlexAttention does
  not support backward on CPU`` before it runs when an input requires grad (the forward pass checks
  it, ``torch.nn.attention.flex_attention._validate_device``). Torch's own dense implementation of
  the operator — ``sdpa_dense`` forward and ``sdpa_dense_backward``, the reference its compiled kernels
  are tested against — runs the pair on the CPU exactly (same results as math attention with the
  score and mask functions applied; tests/test_host_limits.py). The check is answered for the CPU,
  the call is logged in the migration log (``TA-X015``) and one warning says what it costs: memory
  for a full ``L × S`` score matrix per head, where the GPU kernel works blockwise.

  Under ``torch.compile`` inductor has no CPU kernel for the backward (it fails in lowering with an
  IndexError). There the check raises the adapter's error while dynamo traces it: a plain
  ``torch.compile`` breaks the graph at it and runs the attention eagerly, on the exact path above;
  ``fullgraph=True`` stops at the step with the error saying which op, why and what to do (call the
  attention outside the compiled region, e.g. ``torch.compiler.disable``), before inductor's failure.

Real device targets keep torch's checks: their own kernels decide.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["apply", "FLEX", "HostLimitWarning"]

FLEX = "torch.nn.attention.flex_attention"
_BECAME = "torch's dense reference forward and backward (exact; a full L×S score matrix per head)"


class HostLimitWarning(UserWarning):
    """An op torch refuses on the CPU runs another way under the adapter (what it costs)."""


def apply(session: Any) -> None:
    """On a target whose tensors live on the CPU: answer torch's CPU-only refusals (above)."""
    if not session.device_mapper.on_cpu and not session.target.simulated:
        return
    from ..core.after_import import after_import

    after_import(session.patcher, FLEX, lambda module: _flex(session, module))


def _flex(session: Any, module: Any) -> None:
    original = getattr(module, "_validate_device", None)
    if not callable(original):  # a torch without the check (or another name for it): nothing to answer
        return
    log = session.redirect_log
    warned: list[bool] = []

    def _validate_device(query: Any, key: Any, value: Any) -> None:
        if query.device.type != "cpu" or not (query.requires_grad or key.requires_grad or value.requires_grad):
            return original(query, key, value)
        if torch.compiler.is_compiling():
            from ..errors import UnsupportedCudaFeature, format_error

            raise UnsupportedCudaFeature(format_error(
                "flex_attention(...) with inputs that require grad, inside torch.compile",
                "a device whose compiled FlexAttention has a backward kernel (CUDA)",
                f"the {session.target.label} target, whose tensors are on the CPU: inductor has no CPU kernel for "
                "FlexAttention's backward",
                why="torch compiles FlexAttention's backward only for GPUs; outside torch.compile the adapter runs "
                    "torch's exact dense forward and backward on the CPU",
                fix="call the attention outside the compiled region (decorate the function that calls "
                    "flex_attention with @torch.compiler.disable), or run it without grad (torch.no_grad())"))
        log.record("host_limit", "flex_attention(...) backward on the CPU", _BECAME, depth=3)
        if not warned:
            warned.append(True)
            warnings.warn(
                f"torch_adapter: flex_attention with grad on {session.target.label}: torch refuses its backward on "
                "the CPU; it runs as torch's dense reference forward and backward instead (exact, but it holds a "
                "full L×S score matrix per head where a GPU kernel works blockwise; code TA-X015, "
                "docs/reasons.md)", HostLimitWarning, stacklevel=3)

    _validate_device.__wrapped__ = original  # type: ignore[attr-defined]
    session.patcher.set(module, "_validate_device", _validate_device)
