"""The built-in routing rules: data only, each entry with its reason.

The machinery that applies them is :mod:`torch_adapter.routing.decide` (decisions) and
:mod:`torch_adapter.routing.engine` (execution). Keeping the tables here means a new
finding — a decomposition that turned out wrong for training, an op that only touches
metadata — is one line with its evidence, not a code change.
"""

from __future__ import annotations

__all__ = [
    "TRAINING_UNSAFE_DECOMPOSITIONS",
    "METADATA_OPS",
    "VIEW_REASON",
    "ENGINE_OPS",
]

# torch._decomp entries that must not be used to execute an op during training (or at
# all, when the engine runs real numbers): the op then falls back to the CPU instead.
# Found by running models and PyTorch's OpInfo database under the simulated targets
# (tests/test_routing_opinfo.py writes the evidence to its report).
TRAINING_UNSAFE_DECOMPOSITIONS: dict[str, str] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": (
        "export-only decomposition: returns the attention weights where autograd expects the "
        "logsumexp (gradient errors of 2.9e6 on a tiny SD UNet, 0.61 on a BERT-like model)"),
}

# Ops that read or set tensor metadata only (no element is computed): they run wherever the
# tensor lives, with or without a backend kernel.
METADATA_OPS: dict[str, str] = {
    "aten::size.int": "reads the shape",
    "aten::stride.int": "reads the strides",
    "aten::sym_size.int": "reads the shape",
    "aten::sym_stride.int": "reads the strides",
    "aten::sym_numel": "reads the element count",
    "aten::sym_storage_offset": "reads the storage offset",
    "aten::is_same_size": "compares shapes",
    "aten::_has_compatible_shallow_copy_type": "compares tensor types",
    "aten::is_complex": "reads the dtype",
    "aten::is_floating_point": "reads the dtype",
    "aten::is_conj": "reads a flag",
    "aten::is_neg": "reads a flag",
    "aten::_is_zerotensor": "reads a flag",
    "aten::is_inference": "reads a flag",
    "aten::_nested_tensor_size": "reads nested sizes",
    "aten::_nested_tensor_strides": "reads nested strides",
    "aten::result_type.Tensor": "dtype promotion only",
    "aten::result_type.Scalar": "dtype promotion only",
    "aten::can_cast": "dtype rule only",
    "aten::promote_types": "dtype rule only",
    "aten::_version": "reads the version counter",
    "aten::retain_grad": "autograd bookkeeping",
    "aten::requires_grad_": "autograd bookkeeping",
    "aten::_fw_primal": "forward-AD bookkeeping",
    "aten::_make_dual": "forward-AD bookkeeping",
    "aten::_unpack_dual": "forward-AD bookkeeping",
    "aten::set_.source_Tensor": "re-points storage",
    "aten::resize_": "storage bookkeeping",
    "aten::record_stream": "stream bookkeeping",
}

VIEW_REASON = "view op: aliases its input's storage (no kernel needed on the target)"

# Ops the engine itself uses to move tensors to and from the CPU. Routing them through the
# engine would recurse; on every backend they are built from the device's copy kernel.
ENGINE_OPS: frozenset[str] = frozenset({
    "aten::clone",
    "aten::copy_",
    "aten::_to_copy",
    "aten::empty_like",
    "aten::empty.memory_format",
    "aten::empty_strided",
    "aten::resize_",
    "aten::_copy_from",
    "aten::_copy_from_and_resize",
    "aten::_local_scalar_dense",
    "aten::lift_fresh",
    "aten::detach",
    "aten::alias",
})
