"""The built-in routing rules: data only, each entry with its reason.

The machinery that applies them is :mod:`torch_adapter.routing.decide` (decisions) and
:mod:`torch_adapter.routing.engine` (execution). Keeping the tables here means a new
finding — a decomposition that turned out wrong for training, an op that only touches
metadata — is one line with its evidence, not a code change.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "TRAINING_UNSAFE_DECOMPOSITIONS",
    "METADATA_OPS",
    "VIEW_REASON",
    "ENGINE_OPS",
    "ESSENTIAL_REASON",
    "HOST_SELECTED",
    "host_selected",
    "RAISING_COMPOSITES",
    "NATIVE_CHECKS",
    "OVERLAP_WARNS",
    "DECLINED_DECOMPOSITIONS",
    "INTERNAL_OVERLAP_MESSAGE",
    "DEVICE_REFUSING_COMPOSITES",
]

# CompositeExplicitAutograd kernels that only raise "not implemented": the hook a backend is
# meant to override. They are no composite: an op with only this kernel falls back.
RAISING_COMPOSITES: dict[str, str] = {
    "aten::convolution_overrideable": "its CompositeExplicitAutograd kernel only raises 'convolution_overrideable "
                                      "not implemented' (a hook for backends to override)",
    "aten::convolution_backward_overrideable": "its CompositeExplicitAutograd kernel only raises 'not implemented' "
                                               "(a hook for backends to override)",
}

# Argument checks an op's native kernel makes (CPU and CUDA alike) that its torch._decomp reference does
# not: a decomposed call would compute where CUDA raises. Base name (its in-place and out= overloads
# too) -> (check, torch's own message). Checks: "same_dtype" (every tensor argument, out= included).
# Found by PyTorch's test_binary_ufuncs on the emulated npu (heaviside is not in Ascend's table).
NATIVE_CHECKS: dict[str, tuple[str, str]] = {
    "heaviside": ("same_dtype", "heaviside is not yet implemented for tensors with different dtypes."),
}

# In-place ops whose native kernels (CPU and CUDA) only warn, not raise, when the written tensor's elements
# overlap (an expanded self: "Use of index_put_ on expanded tensors is deprecated"); every other op's kernel
# raises aten's "more than one element of the written-to tensor refers to a single memory location" (its
# TensorIterator or an explicit assert_no_internal_overlap), which a torch._decomp reference does not:
# index_add_'s decomposition (index_put_ with accumulate) only warned on the emulated npu (test_torch's
# test_index_add_mem_overlap).
OVERLAP_WARNS: frozenset[str] = frozenset({"index_put", "masked_fill", "index_fill", "masked_scatter"})
INTERNAL_OVERLAP_MESSAGE = ("unsupported operation: more than one element of the written-to tensor refers to a "
                            "single memory location. Please clone() the tensor before performing the operation.")

# CompositeExplicitAutograd kernels that refuse every device but the in-tree ones they name: on another
# device (PrivateUse1: npu) the composite only raises, so the op runs on the CPU there. op -> (the device
# keys the kernel accepts, why). Found by PyTorch's test_reductions on the emulated npu.
DEVICE_REFUSING_COMPOSITES: dict[str, tuple[frozenset[str], str]] = {
    "aten::mode.values": (frozenset({"CPU", "CUDA", "XPU"}),
                          "its CompositeExplicitAutograd kernel (mode_out) refuses other devices ('mode only "
                          "supports CPU, CUDA and XPU device type')"),
}

# torch._decomp entries that must not be used to execute an op during training (or at
# all, when the engine runs real numbers): the op then falls back to the CPU instead.
# Found by running models and PyTorch's OpInfo database under the simulated targets
# (tests/test_routing_opinfo.py writes the evidence to its report).
TRAINING_UNSAFE_DECOMPOSITIONS: dict[str, str] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": (
        "export-only decomposition: returns the attention weights where autograd expects the "
        "logsumexp (gradient errors of 2.9e6 on a tiny SD UNet, 0.61 on a BERT-like model)"),
}

# torch._decomp entries that are wrong for some arguments the native kernel takes: for those the
# decomposition is declined and the op falls back (its own kernel runs). op -> (the arguments, as a test
# over the positional arguments, and why). Found by PyTorch's test_torch / test_nn on the emulated npu.
def _integral_self(args: tuple) -> bool:
    a = args[0] if args else None
    return hasattr(a, "is_floating_point") and not (a.is_floating_point() or a.is_complex())


def _zero_dim_index(args: tuple) -> bool:
    return len(args) > 2 and hasattr(args[2], "dim") and args[2].dim() == 0


def _one_dim_input(args: tuple) -> bool:
    return bool(args) and hasattr(args[0], "dim") and args[0].dim() <= 1


DECLINED_DECOMPOSITIONS: dict[str, tuple[Any, str]] = {
    # CUDA's and the CPU's geometric_ fill integer tensors (test_torch's test_geometric)
    "aten::geometric_": (_integral_self, "its torch._decomp reference draws uniform_ in self's dtype, which an "
                                         "integer tensor lacks"),
    # a 0-dim index adds one slice (AdaptiveLogSoftmax's backward: "value tensor of shape [1, 16] cannot be
    # broadcast to indexing result of shape [16]")
    "aten::index_add_": (_zero_dim_index, "its torch._decomp reference indexes with a 0-dim index as a scalar"),
    "aten::index_add": (_zero_dim_index, "its torch._decomp reference indexes with a 0-dim index as a scalar"),
    # a 1-d input with a 0-d target: the kernel's result is 0-dim, the reference's has shape [1]
    "aten::multi_margin_loss": (_one_dim_input, "its torch._decomp reference returns shape [1] for a 1-d input "
                                                "where the kernel returns a 0-dim result"),
}

# Ops that read or set tensor metadata only (no element is computed): they run wherever the
# tensor lives, with or without a backend kernel.
METADATA_OPS: dict[str, str] = {
    "aten::size.int": "reads the shape",
    # TorchScript's tensor-attribute primitives (graphs dynamo's eager backend runs call them: FlexAttention's
    # wrapper asks prim::device): answered from the tensor, no kernel on any device
    "prim::device": "reads the device", "prim::dtype": "reads the dtype", "prim::layout": "reads the layout",
    "prim::is_cuda": "reads the device", "prim::requires_grad": "reads a flag", "prim::data": "the tensor's data",
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

ESSENTIAL_REASON = ("device-essential op (allocation, copy or reading a scalar): every backend implements it, "
                    "whatever its op table lists")

# Kernels the CPU *host* selects inside another op (fnmatch pattern -> what the target does
# instead). A simulated target executes on this machine, so it sees them; in eager code the
# real target's op selects its own kernel and never calls these, but an exported graph traced
# here does contain them. They keep their route (fallback) and carry this note in the reason;
# coverage reports mark them.
HOST_SELECTED: dict[str, str] = {
    "aten::mkldnn_rnn_layer*": "the CPU's oneDNN RNN kernel, picked by aten::lstm on this host; "
                               "a real target's aten::lstm picks its own (cuDNN on cuda, _lstm_mps on mps)",
    "aten::_scaled_dot_product_flash_attention_for_cpu*": "the CPU's attention kernel, picked by "
                                                          "scaled_dot_product_attention on this host; a real "
                                                          "target picks its own (flash/efficient on cuda, math on mps)",
    "aten::_slow_conv2d_*": "the CPU's convolution kernel, picked by aten::convolution on this host; "
                            "a real target picks its own convolution kernel",
    "aten::slow_conv*": "the CPU's convolution kernel, picked by aten::convolution on this host; "
                        "a real target picks its own convolution kernel",
    "aten::mkldnn_*": "a oneDNN (CPU) kernel picked on this host; a real target picks its own",
    "aten::_nnpack_*": "an NNPACK (CPU) kernel picked on this host; a real target picks its own",
}


def host_selected(op: str) -> str:
    """The :data:`HOST_SELECTED` note for ``op`` ("" when it is not a host-selected kernel)."""
    import fnmatch

    for pattern, note in HOST_SELECTED.items():
        if fnmatch.fnmatchcase(op, pattern):
            return note
    return ""
