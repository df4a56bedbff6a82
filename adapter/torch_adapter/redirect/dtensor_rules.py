"""DTensor sharding rules for the host kernels a CUDA program reaches on the CPU target.

``F.scaled_dot_product_attention`` picks its kernel by device: on CUDA the flash or
memory-efficient kernel, for which DTensor has sharding strategies; on the CPU
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward), for which torch
2.13 has none, so tensor-parallel attention written for CUDA (pytorch/examples'
``fsdp_tp_example.py``, any Llama with ``ColwiseParallel`` q/k/v) stops on the CPU with
"does not have a sharding strategy registered". A PrivateUse1 device whose attention is the
host's fused kernel reaches the same op: the emulated npu's ``_fused_sdp_choice`` picks it as
torch_npu's picks its own (without a choice the math decomposition's causal mask, a plain tensor,
met the DTensor inputs: "aten.add.Tensor got mixed torch.Tensor and DTensor"). While installed on
any target but CUDA, these ops get the strategies the CUDA flash kernel has: everything replicated,
sharded on the heads (tensor parallel), or on the batch — for one mesh dimension, expanded
over the mesh by DTensor itself. The rules are registered when ``torch.distributed.tensor``
is (or gets) imported and removed at uninstall; an op torch has its own strategy for is
left alone. Masks passed as DTensors are not covered (the ops take them as keywords).
"""

from __future__ import annotations

from typing import Any

__all__ = ["RULES", "apply"]


def _forward(args: Any) -> list[list[Any]]:
    from torch.distributed.tensor import Replicate, Shard

    # [output, logsumexp, query, key, value]: replicated; heads (dim 1); batch (dim 0)
    return [[Replicate()] * 5, [Shard(1)] * 5, [Shard(0)] * 5]


def _backward(args: Any) -> list[list[Any]]:
    from torch.distributed.tensor import Replicate, Shard

    # [grad_q, grad_k, grad_v, grad_out, query, key, value, out, logsumexp]
    return [[Replicate()] * 9, [Shard(1)] * 9, [Shard(0)] * 9]


# op name (aten) -> (placements for one mesh dim, index of the first input, first static argument)
RULES: dict[str, tuple[Any, int, int]] = {
    "_scaled_dot_product_flash_attention_for_cpu.default": (_forward, 2, 3),
    "_scaled_dot_product_flash_attention_for_cpu_backward.default": (_backward, 3, 6),
}

_DTENSOR = "torch.distributed.tensor"


def _register(session: Any) -> None:
    import torch

    from ..core.torch_private import dtensor_register_strategy

    for name, (placements, input_index, static_argnum) in RULES.items():
        packet, overload = name.rsplit(".", 1)
        op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        if op is None:
            continue  # a torch without this kernel
        undo = dtensor_register_strategy(op, placements, input_index, static_argnum)
        if undo is not None:  # off when the session is suspended or closed; on again at resume
            session.patcher.after_restore(undo)


def apply(session: Any) -> None:
    """Register the rules now if DTensor is loaded, else right after it first loads."""
    import torch.distributed as dist

    if session.device_mapper.type == "cuda" or not dist.is_available():  # (CUDA has no host kernel to reach)
        return
    from ..core.after_import import after_import

    after_import(session.patcher, _DTENSOR, lambda module: _register(session))
