"""Device-selected kernel families: data, one place.

Some aten ops pick their kernel by the device of their inputs: ``aten::_convolution`` calls
``cudnn_convolution`` on cuda, ``_mps_convolution`` on mps, ``convolution_overrideable`` on
xpu and PrivateUse1 backends, and ``_slow_conv2d_forward`` or ``mkldnn_convolution`` on a
CPU. A simulated target executes on this (CPU) host, so the host's member runs; on the real
device the target's own member would. :mod:`.decide` therefore routes a *host member* on a
simulated target as the target's member of its family (the first member below whose kernel
the target has; else the family's ``generic`` path), and names the host's kernel in the
reason. Nothing here is executed: the host kernel still computes the numbers.

Each :class:`Family` lists its members in the order a device tries them; ``host_only``
members are CPU kernels that never are a simulated target's choice. A member's ops are one
per *role* (``forward``, ``backward``); ``None`` means the role is autograd through the
member's pieces (no backward kernel of its own). Order within a family follows what torch
picks for the float32 models of ``torch-adapter coverage`` (e.g. cuda's SDPA: efficient
attention — flash needs half precision).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

__all__ = ["Member", "Family", "FAMILIES", "DEVICE_REGISTERED", "host_member", "family_of_op", "all_ops",
           "HOST_ONLY", "is_host_only"]


@dataclass(frozen=True)
class Member:
    backend: str
    forward: str
    backward: str | None = None
    host_only: bool = False  # a kernel only the CPU selects (oneDNN, slow/NNPACK convolutions, _for_cpu)


@dataclass(frozen=True)
class Family:
    name: str
    selector: str  # the op whose kernel picks the member by device
    members: tuple[Member, ...]  # in the order a device tries them
    generic: Member | None  # what a device without any member's kernel runs (None: the host op's own route)
    host_ops: dict[str, str]  # host kernel (fnmatch pattern) -> role ("forward" / "backward")


FAMILIES: tuple[Family, ...] = (
    Family("convolution", "aten::_convolution", (
        Member("cudnn", "aten::cudnn_convolution", "aten::convolution_backward"),
        Member("miopen", "aten::miopen_convolution", "aten::convolution_backward"),
        Member("mps", "aten::_mps_convolution", "aten::mps_convolution_backward"),
        Member("vendor convolution", "aten::convolution", "aten::convolution_backward"),  # e.g. Ascend's
        Member("overrideable", "aten::convolution_overrideable", "aten::convolution_backward_overrideable"),
        Member("mkldnn", "aten::mkldnn_convolution", None, host_only=True),
        Member("slow", "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward.output_mask", host_only=True),
        Member("nnpack", "aten::_nnpack_spatial_convolution", None, host_only=True)),
        Member("overrideable", "aten::convolution_overrideable", "aten::convolution_backward_overrideable"),
        {"aten::mkldnn_convolution": "forward", "aten::_slow_conv2d_forward*": "forward",
         "aten::_slow_conv2d_backward*": "backward", "aten::slow_conv3d_forward*": "forward",
         "aten::slow_conv_dilated[23]d*": "forward", "aten::_nnpack_spatial_convolution*": "forward",
         "aten::mkldnn_convolution_backward*": "backward"}),
    Family("convolution_transpose", "aten::_convolution", (
        Member("cudnn", "aten::cudnn_convolution_transpose", "aten::convolution_backward"),
        Member("miopen", "aten::miopen_convolution_transpose", "aten::convolution_backward"),
        Member("mps", "aten::_mps_convolution_transpose", "aten::mps_convolution_transpose_backward"),
        Member("vendor convolution", "aten::convolution", "aten::convolution_backward"),
        Member("overrideable", "aten::convolution_overrideable", "aten::convolution_backward_overrideable"),
        Member("slow", "aten::slow_conv_transpose2d", None, host_only=True)),
        Member("overrideable", "aten::convolution_overrideable", "aten::convolution_backward_overrideable"),
        {"aten::slow_conv_transpose[23]d*": "forward"}),
    Family("scaled_dot_product_attention", "aten::_fused_sdp_choice", (
        Member("vendor attention", "aten::scaled_dot_product_attention", None),  # Ascend lists the op itself
        Member("efficient", "aten::_scaled_dot_product_efficient_attention",
               "aten::_scaled_dot_product_efficient_attention_backward"),
        Member("flash", "aten::_scaled_dot_product_flash_attention",
               "aten::_scaled_dot_product_flash_attention_backward"),
        Member("cudnn", "aten::_scaled_dot_product_cudnn_attention",
               "aten::_scaled_dot_product_cudnn_attention_backward"),
        Member("overrideable", "aten::_scaled_dot_product_fused_attention_overrideable",
               "aten::_scaled_dot_product_fused_attention_overrideable_backward"),
        # (mps's _scaled_dot_product_attention_math_for_mps is not listed: it has no autograd formula, so a
        # training step on mps takes the math path)
        Member("cpu", "aten::_scaled_dot_product_flash_attention_for_cpu",
               "aten::_scaled_dot_product_flash_attention_for_cpu_backward", host_only=True)),
        Member("math", "aten::_scaled_dot_product_attention_math", None),
        {"aten::_scaled_dot_product_flash_attention_for_cpu": "forward",
         "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "backward"}),
    Family("lstm", "aten::lstm.input", (
        Member("vendor lstm", "aten::lstm.input", None),  # Ascend lists the op itself
        Member("cudnn", "aten::_cudnn_rnn", "aten::_cudnn_rnn_backward"),
        Member("miopen", "aten::miopen_rnn", "aten::miopen_rnn_backward"),
        Member("mps", "aten::_lstm_mps", "aten::lstm_mps_backward"),
        Member("fused cell", "aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_lstm_cell_backward_impl"),
        Member("mkldnn", "aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward", host_only=True)),
        Member("composite cells", "aten::lstm.input", None),
        {"aten::mkldnn_rnn_layer": "forward", "aten::mkldnn_rnn_layer_backward": "backward"}),
    Family("batch_norm", "aten::_batch_norm_impl_index", (
        Member("cudnn", "aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward"),
        Member("miopen", "aten::miopen_batch_norm", "aten::miopen_batch_norm_backward"),
        Member("native", "aten::native_batch_norm", "aten::native_batch_norm_backward")),
        None,
        {"aten::native_batch_norm": "forward", "aten::native_batch_norm_backward": "backward"}),
    Family("embedding_bag", "aten::embedding_bag", (
        Member("native", "aten::_embedding_bag", "aten::_embedding_bag_backward"),),
        None,
        {}),  # forward_only vs not is chosen by requires_grad, the same on every device: the host's choice stands
    Family("ctc_loss", "aten::ctc_loss.IntList", (
        Member("cudnn", "aten::_cudnn_ctc_loss", None),
        Member("native", "aten::_ctc_loss", "aten::_ctc_loss_backward")),
        None,
        {}),  # cuDNN's only for int32 CPU targets, blank 0, ...: by arguments, so the host's _ctc_loss stands
    Family("grid_sampler", "aten::grid_sampler", (
        Member("cudnn", "aten::cudnn_grid_sampler", "aten::cudnn_grid_sampler_backward"),
        Member("native", "aten::grid_sampler_2d", "aten::grid_sampler_2d_backward")),
        None,
        {}),  # cuDNN's only for bilinear, zero padding, align_corners: by arguments, so the host's choice stands
)

# Kernels a backend registers in C++ (TORCH_LIBRARY_IMPL) outside any op table the profiles
# read: target -> {op: where}. Evidence: PyTorch's aten/src/ATen/native/mkldnn/xpu/Conv.cpp
# registers the XPU convolution (oneDNN) for these two overloads.
DEVICE_REGISTERED: dict[str, dict[str, str]] = {
    "xpu": {"aten::convolution_overrideable": "PyTorch's mkldnn/xpu/Conv.cpp (oneDNN), registered in C++",
            "aten::convolution_backward_overrideable": "PyTorch's mkldnn/xpu/Conv.cpp (oneDNN), registered in C++"},
}

_EXACT: dict[str, tuple[Family, str]] = {}


def host_member(op: str) -> tuple[Family, str] | None:
    """``(family, role)`` when ``op`` is a member kernel the CPU host selects, else None."""
    hit = _EXACT.get(op)
    if hit is not None:
        return hit
    for fam in FAMILIES:
        for pattern, role in fam.host_ops.items():
            if fnmatch.fnmatchcase(op, pattern):
                _EXACT[op] = (fam, role)
                return fam, role
    return None


def family_of_op(op: str) -> Family | None:
    """The family ``op`` belongs to (as a member, host kernel or selector), if any."""
    hit = host_member(op)
    if hit is not None:
        return hit[0]
    for fam in FAMILIES:
        if op == fam.selector or any(op in (m.forward, m.backward) for m in fam.members):
            return fam
    return None


def all_ops() -> set[str]:
    """Every op name the table mentions (tests check this torch knows them)."""
    names: set[str] = set()
    for fam in FAMILIES:
        names.add(fam.selector)
        for m in (*fam.members, *((fam.generic,) if fam.generic else ())):
            names.add(m.forward)
            if m.backward:
                names.add(m.backward)
    return names


# Kernels only a CPU selects (fnmatch): never a simulated target's own choice. The test over
# every coverage family x simulated target asserts none of them is ever routed fallback.
HOST_ONLY: tuple[str, ...] = (
    "aten::mkldnn_*", "aten::_slow_conv2d_*", "aten::slow_conv3d*", "aten::slow_conv_dilated*",
    "aten::slow_conv_transpose*", "aten::_nnpack_*", "aten::_scaled_dot_product_flash_attention_for_cpu*",
)


def is_host_only(op: str) -> bool:
    return any(fnmatch.fnmatchcase(op, p) for p in HOST_ONLY)
