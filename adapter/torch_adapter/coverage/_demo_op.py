"""The custom op of the ``custom_op`` family: ``torch_adapter_demo::fused_gelu``.

Defined with ``torch.library.custom_op`` with a **CPU kernel only** (``device_types="cpu"``),
as a vendor or a user ships a fused kernel for one backend. On a simulated target it has
no kernel and no decomposition, so it routes as ``fallback`` — until
``torch_adapter.register_accelerated("torch_adapter_demo::fused_gelu", fn, device=...)``
gives the target one. Its backward is written with aten ops (routed like any other).

The op is registered on first use of :func:`demo_op` (never at import), once per process.
"""

from __future__ import annotations

import functools
import math
from typing import Any

__all__ = ["DEMO_OP", "demo_op"]

DEMO_OP = "torch_adapter_demo::fused_gelu"


@functools.lru_cache(maxsize=None)
def demo_op() -> Any:
    """The op (an OpOverloadPacket's default overload, callable on tensors)."""
    import torch

    @torch.library.custom_op(DEMO_OP, mutates_args=(), device_types="cpu", schema="(Tensor x) -> Tensor")
    def fused_gelu(x: Any) -> Any:
        """GELU (erf form) in one call: what a vendor's fused kernel computes."""
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    @fused_gelu.register_fake
    def _(x: Any) -> Any:
        return torch.empty_like(x)

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(inputs[0])

    def backward(ctx: Any, grad: Any) -> Any:
        (x,) = ctx.saved_tensors
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return grad * (cdf + x * pdf)

    fused_gelu.register_autograd(backward, setup_context=setup_context)
    return torch.ops.torch_adapter_demo.fused_gelu.default
