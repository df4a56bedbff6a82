"""Dtype capability of targets (data): which dtypes a backend refuses, and what it raises.

Simulated targets model which *ops* a backend has (:mod:`.profiles`); this module models
which *dtypes* it can hold. Each fact names its source. A profile whose backend has no
dtype data here (``npu``, ``mtia``, a ``.toml`` without a base or ``[dtypes]``) carries
``dtypes=None``: the preview then says it *cannot judge* dtypes, never that all is fine.

Sources (read for this table; the project ships none of their code):

- MPS — pytorch ``aten/src/ATen/mps/EmptyTensor.cpp``, ``empty_mps`` / ``empty_strided_mps``:
  ``TORCH_CHECK_TYPE(dtype != ScalarType::Double, MPS_ERROR_DOUBLE_NOT_SUPPORTED)`` (a
  ``TypeError`` in Python, raised when the tensor is created); ``aten/src/ATen/native/mps/
  OperationUtils.mm``, ``getMPSDataType``: ``ComplexDouble`` (and every type without a case)
  hits ``"Trying to convert ... to the MPS backend but it does not have support for that
  dtype."``; ``checkSupportsBFloat16`` / ``checkSupportsComplex`` (``OperationUtils.mm``,
  ``supportsComplex`` in ``OperationUtils.h``): bfloat16 and complex64/complex32 need macOS 14.
- XPU — Intel client GPUs (Arc A-series, integrated Xe) have no fp64 aspect: SYCL refuses the
  first kernel touching float64/complex128 with ``RuntimeError: Required aspect fp64 is not
  supported on the device`` (intel/torch-xpu-ops#1742, Arc A770, torch 2.7.1+xpu;
  intel/torch-xpu-ops#818 and #1270 filter fp64 out of Arc's test dtypes); torch itself asks
  ``torch.xpu.get_device_properties(d).has_fp64`` (``torch/_tensor_str.py``, ``tensor_totype``).
  Data-centre GPUs (Max 1100/1550) have fp64.
- CUDA, CPU — every dtype of ``native_functions.yaml``'s dispatch macros (``AT_DISPATCH_*``
  include Double and ComplexDouble): nothing refused.
- Ascend NPU — the vendor op tables (``../shared/target-data/ascend``) list no supported
  dtypes per op (their ``gen_opapi`` ``dtype:`` entries say which dtype an *output* gets), so
  ``npu`` has no dtype data.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["Refusal", "DtypeCaps", "VARIANTS", "DEFAULT_VARIANT", "NO_DATA", "caps_for", "dtype_names",
           "torch_dtype", "DEVICE_AWARE"]

_MPS_EMPTY = "pytorch aten/src/ATen/mps/EmptyTensor.cpp: empty_mps, empty_strided_mps (MPS_ERROR_DOUBLE_NOT_SUPPORTED)"
_MPS_TYPES = "pytorch aten/src/ATen/native/mps/OperationUtils.mm: getMPSDataType (default case)"
_MPS_BF16 = "pytorch aten/src/ATen/native/mps/OperationUtils.mm: checkSupportsBFloat16 (macOS 14.0 or newer)"
_MPS_COMPLEX = ("pytorch aten/src/ATen/native/mps/OperationUtils.mm: checkSupportsComplex; "
                "OperationUtils.h: supportsComplex (macOS 14.0 or newer)")
_XPU_FP64 = ("intel/torch-xpu-ops#1742 (Arc A770: 'Required aspect fp64 is not supported on the device'); "
             "intel/torch-xpu-ops#818, #1270 (fp64 dtypes filtered out on Arc); torch/_tensor_str.py: tensor_totype "
             "(torch.xpu.get_device_properties().has_fp64)")


@dataclass(frozen=True)
class Refusal:
    """One dtype a backend refuses: the exception class it raises, its message, the source."""

    dtype: str  # "float64"
    error: str  # "TypeError" | "RuntimeError"
    message: str  # what the real backend says
    source: str

    def as_dict(self) -> dict[str, str]:
        return {"dtype": self.dtype, "error": self.error, "message": self.message, "source": self.source}


@dataclass(frozen=True, eq=False)
class DtypeCaps:
    """What one backend (and device variant) does with dtypes. ``refused``: dtypes no op takes;
    ``ops``: per-op supported dtypes where a source lists them (others refused for that op)."""

    target: str  # "mps"
    variant: str  # "macos14"
    label: str  # "MPS on macOS 14 or newer"
    refused: Mapping[str, Refusal] = field(default_factory=dict)
    ops: Mapping[str, frozenset[str]] = field(default_factory=dict)
    op_sources: Mapping[str, str] = field(default_factory=dict)
    source: str = ""

    def refusal(self, dtype: str, op: str | None = None) -> Refusal | None:
        """Why the backend refuses ``dtype`` (for ``op``), or None when it takes it."""
        hit = self.refused.get(dtype)
        if hit is not None or op is None or op not in self.ops or dtype in self.ops[op]:
            return hit
        allowed = ", ".join(sorted(self.ops[op]))
        return Refusal(dtype, "TypeError", f"{op} on {self.target} does not support {dtype} (it takes {allowed})",
                       self.op_sources.get(op, self.source))

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "variant": self.variant, "label": self.label, "source": self.source,
                "refused": [r.as_dict() for r in self.refused.values()],
                "ops": {op: sorted(d) for op, d in sorted(self.ops.items())}}

    def summary(self) -> str:
        """``"refuses float64, complex128 (MPS on macOS 14 or newer)"``; for ``targets`` and reports."""
        parts = sorted(self.refused)
        head = f"refuses {', '.join(parts)}" if parts else "takes every dtype"
        if self.ops:
            head += f"; {len(self.ops)} ops with their own dtype lists"
        return f"{head} ({self.label})"


def _mps_double() -> Refusal:
    return Refusal("float64", "TypeError", "Cannot convert a MPS Tensor to float64 dtype as the MPS framework "
                   "doesn't support float64. Please use float32 instead.", _MPS_EMPTY)


def _mps_other(dtype: str, c10_name: str) -> Refusal:
    return Refusal(dtype, "TypeError", f"Trying to convert {c10_name} to the MPS backend but it does not have "
                   "support for that dtype.", _MPS_TYPES)


def _mps_macos13() -> dict[str, Refusal]:
    return {"bfloat16": Refusal("bfloat16", "TypeError", "MPS bfloat16 type is supported on MacOS 14.0 or newer.",
                                _MPS_BF16),
            **{d: Refusal(d, "TypeError", "MPS complex types are only supported on MacOS 14.0 or newer.", _MPS_COMPLEX)
               for d in ("complex64", "complex32")}}


def _xpu_fp64() -> dict[str, Refusal]:
    return {d: Refusal(d, "RuntimeError", "Required aspect fp64 is not supported on the device", _XPU_FP64)
            for d in ("float64", "complex128")}


# target -> variant -> (label, refused dtypes); the first variant is the default
VARIANTS: dict[str, dict[str, tuple[str, Any]]] = {
    "mps": {"macos14": ("MPS on macOS 14 or newer", lambda: {"float64": _mps_double(),
                                                            "complex128": _mps_other("complex128", "ComplexDouble")}),
            "macos13": ("MPS on macOS 13", lambda: {"float64": _mps_double(),
                                                   "complex128": _mps_other("complex128", "ComplexDouble"),
                                                   **_mps_macos13()})},
    "xpu": {"fp64": ("Intel GPU with fp64 (Data Center GPU Max)", dict),
            "arc": ("Intel client GPU without fp64 (Arc, integrated Xe)", _xpu_fp64)},
    "cuda": {"default": ("CUDA (every dtype)", dict)},
    "cpu": {"default": ("CPU (every dtype)", dict)},
}
DEFAULT_VARIANT = {target: next(iter(v)) for target, v in VARIANTS.items()}
_SOURCES = {"mps": f"{_MPS_EMPTY}; {_MPS_TYPES}", "xpu": _XPU_FP64,
            "cuda": "native_functions.yaml dispatch macros (Double, ComplexDouble included)",
            "cpu": "native_functions.yaml dispatch macros (Double, ComplexDouble included)"}
# built-in profiles without dtype data, and why (shown as "cannot judge dtypes")
NO_DATA = {"npu": "the Ascend op tables list no supported dtypes per op (their gen_opapi dtype: entries give "
                  "output dtypes), so this preview cannot judge dtypes",
           "mtia": "no source lists MTIA's dtypes, so this preview cannot judge dtypes"}

# Code that picks its dtype by the device it runs on: on the real target it takes a supported
# one, on a simulated target (CPU tensors) it would not. (file suffix, the targets it spares, why)
# — looked at only on a refusal, so it costs nothing on supported dtypes.
DEVICE_AWARE = (
    ("torch/_tensor_str.py", ("mps", "xpu"),
     "torch's tensor printing uses float32 on MPS and on an XPU without fp64 (tensor_totype)"),
    ("torch/amp/grad_scaler.py", ("mps",),
     "GradScaler.unscale_ computes the inverse scale in float64 except on mps:0"),
)


@functools.lru_cache(maxsize=None)
def caps_for(target: str, variant: str | None = None) -> DtypeCaps | None:
    """The dtype capability of a built-in target (and variant); None where no data exists."""
    table = VARIANTS.get(target)
    if table is None:
        return None
    variant = variant or DEFAULT_VARIANT[target]
    label, refused = table[variant]
    return DtypeCaps(target, variant, label, refused=dict(refused()), source=_SOURCES[target])


@functools.lru_cache(maxsize=1)
def dtype_names() -> tuple[str, ...]:
    """Every dtype name this torch has (``"float64"``, ``"bfloat16"``, ...): the names a profile may use."""
    import torch

    return tuple(sorted({str(v).removeprefix("torch.") for v in vars(torch).values() if isinstance(v, torch.dtype)}))


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def live_caps(target: str) -> DtypeCaps | None:
    """The dtype capability of this machine's real ``target``, where torch can tell: an XPU's
    ``has_fp64`` property, the macOS version for MPS; the table's default otherwise."""
    if target == "xpu":
        try:
            import torch

            has_fp64 = bool(torch.xpu.get_device_properties(0).has_fp64)
        except Exception:  # no XPU build / no device: the table's default
            return caps_for("xpu")
        return caps_for("xpu", "fp64" if has_fp64 else "arc")
    if target == "mps":
        import platform

        major = platform.mac_ver()[0].partition(".")[0]
        return caps_for("mps", "macos13" if major == "13" else None)
    return caps_for(target)
