"""The dtype policy: what a CUDA-written program's float16 request gives on a CPU target.

``install(dtype_policy=...)`` / ``configure`` / ``torch-adapter run --dtype-policy``:

``auto``     float32 tensors wherever float16 work is computed in float32 (a CPU with no
             low-precision units, or whose bfloat16 kernels measured no faster: the session's
             ``float16_compute`` decision, routing/low_precision.py); float16 tensors elsewhere.
``float16``  float16 tensors, as the program asked (the heavy ops still computed in the CPU's fast dtype).
``float32``  float32 tensors on every CPU.

Why: where float16 is computed in float32 anyway, keeping float16 *storage* costs two casts per
heavy op and float16 elementwise kernels, and nothing is gained (docs/redirect.md measures 0.85–1.01× of
plain float32 on such CPUs). The program then runs its float32 path — the kernels plain CPU torch
runs, float32 numerics (closer to the float32 reference than CUDA's float16) — and ``tensor.dtype``
says float32 (it does not lie: the tensor *is* float32), files are saved in float32.

Where a float16 request is met, all on the session's Patcher, each logged (redirect log, ``dtype`` rows):
the ``dtype=`` of every device factory, ``*_like`` and ``Tensor.new_*`` (redirect/devices.py);
``Tensor.to(torch.float16)`` / ``.to(device, torch.float16)`` / ``.to(dtype=...)``, and a float16 tensor
moved to a CUDA device (``.to("cuda")``, ``.cuda()``, ``Module.to("cuda")``); ``Tensor.half()`` (and so
``Module.half()``), ``Tensor.type(torch.float16 / "torch.cuda.HalfTensor")``,
``torch.set_default_dtype(torch.float16)``; the float16 tensors of ``torch.load`` onto the device
(``map_location`` CUDA, or none: a CUDA checkpoint) and of ``safetensors`` ``load_file(device="cuda")``;
``autocast("cuda", float16)`` runs disabled (float32), as ``amp_dtype="float32"`` (redirect/amp.py).
Not mapped: a bit reinterpretation (``Tensor.view(torch.float16)``), an op's own ``dtype=`` argument
(``softmax(x, dtype=torch.float16)``), ``torch.from_numpy`` of a float16 array until it moves to the
device.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ..core import caller_warnings
from ..core.config import float16_tensors
from ..core.patching import mark_stand_in

__all__ = ["storage_dtype", "apply", "patch", "to_args", "module_moved", "loaded", "is_half"]

_HALF = torch.float16


def is_half(t: torch.Tensor) -> bool:
    """``t.dtype is torch.float16``, read without calling a tensor subclass's ``__torch_function__``:
    the program's subclass sees exactly its own calls, not the adapter's look at the dtype."""
    with torch._C.DisableTorchFunctionSubclass():
        return t.dtype is _HALF


def storage_dtype(policy: str, compute: torch.dtype | None, compute_why: str) -> tuple[torch.dtype | None, str]:
    """(what a float16 request gives — None: float16 itself —, why) under ``policy`` when the session
    computes float16 heavy ops in ``compute`` (None: as float16, or not a CPU target)."""
    name = float16_tensors(policy, None if compute is None else str(compute)[6:])
    if name == "float16":
        return None, f"dtype_policy={policy!r}"
    if policy == "auto":
        return torch.float32, f"dtype_policy='auto': float16 work is computed in float32 here ({compute_why})"
    return torch.float32, f"dtype_policy={policy!r}"


def apply(session: Any) -> None:
    """Bring the session's float16 mapping in line with its settings (install, resume, configure):
    read on every request by the patches below and in redirect/devices.py."""
    mapper = getattr(session, "device_mapper", None)
    if mapper is None or not mapper.on_cpu or session.target.simulated:
        return  # a simulated target previews another backend: its dtypes stay the program's
    rewrite = getattr(session, "low_precision", None)
    compute = None if rewrite is None else rewrite.dtype
    mapper.half_as, mapper.half_why = storage_dtype(session.config.dtype_policy, compute,
                                                    "" if rewrite is None else rewrite.why)


def patch(p: Any, mapper: Any, orig_to: Callable) -> None:
    """The float16 entry points redirect/devices.py does not already wrap (CPU targets only)."""
    T = torch.Tensor
    orig_half = T.half

    def half(self: torch.Tensor, memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        if mapper.half_as is None:
            return orig_half(self, memory_format=memory_format)
        return orig_to(self, mapper.dtype(_HALF, "Tensor.half()"), memory_format=memory_format)

    p.set(T, "half", functools.wraps(orig_half)(caller_warnings.pass_through(half)))

    orig_default = torch.set_default_dtype

    @functools.wraps(orig_default)
    def set_default_dtype(d: Any, /) -> None:
        return orig_default(mapper.dtype(d, "torch.set_default_dtype(torch.float16)") if d is _HALF else d)

    p.set(torch, "set_default_dtype", mark_stand_in(set_default_dtype, orig_default))


def to_args(mapper: Any, tensor: torch.Tensor, args: tuple, kwargs: dict, moved: bool) -> tuple[tuple, dict]:
    """``Tensor.to``'s arguments with a float16 request mapped (``mapper.half_as`` is set); ``moved``:
    the call moves the tensor to a CUDA device (a float16 tensor then becomes the policy's dtype)."""
    if args and args[0] is _HALF:
        return (mapper.dtype(_HALF, "Tensor.to(torch.float16)"), *args[1:]), kwargs
    if len(args) > 1 and args[1] is _HALF:
        return (args[0], mapper.dtype(_HALF, "Tensor.to(device, torch.float16)"), *args[2:]), kwargs
    if kwargs.get("dtype") is _HALF:
        return args, {**kwargs, "dtype": mapper.dtype(_HALF, "Tensor.to(dtype=torch.float16)")}
    if moved and "dtype" not in kwargs and not (len(args) > 1 and type(args[1]) is torch.dtype) and is_half(tensor):
        return args, {**kwargs, "dtype": mapper.dtype(_HALF, "Tensor.to('cuda') of a float16 tensor")}
    return args, kwargs


def module_moved(mapper: Any, module: Any) -> Any:
    """After ``Module.to("cuda")``: its float16 parameters and buffers in the policy's dtype."""
    if mapper.half_as is None:
        return module
    dtype = mapper.half_as
    if any(is_half(t) for t in _tensors(module)):
        mapper.dtype(_HALF, "Module.to('cuda') of float16 weights")
        module._apply(lambda t: t.to(dtype) if is_half(t) else t)
    return module


def _tensors(module: Any) -> Any:
    yield from module.parameters()
    yield from module.buffers()


def loaded(mapper: Any, obj: Any, asked: str) -> Any:
    """``obj`` (what torch.load / safetensors loaded onto the device) with its float16 tensors in the
    policy's dtype: tensors, modules, and the dicts, lists and tuples holding them (state dicts)."""
    if mapper.half_as is None:
        return obj
    found: list[bool] = []

    def walk(x: Any, depth: int = 0) -> Any:
        if isinstance(x, torch.Tensor):
            if is_half(x):
                found.append(True)
                out = orig_tensor_to(x, mapper.half_as)
                return torch.nn.Parameter(out, x.requires_grad) if isinstance(x, torch.nn.Parameter) else out
            return x
        if depth > 8:
            return x
        if isinstance(x, torch.nn.Module):
            if any(is_half(t) for t in _tensors(x)):
                found.append(True)
                x._apply(lambda t: orig_tensor_to(t, mapper.half_as) if is_half(t) else t)
            return x
        if isinstance(x, dict):
            new = {k: walk(v, depth + 1) for k, v in x.items()}
            if any(new[k] is not x[k] for k in x):
                try:
                    copy = type(x)(new) if type(x) is not dict else new  # an OrderedDict stays one
                except Exception:
                    copy = new
                if hasattr(x, "_metadata"):  # a state dict's version metadata
                    copy._metadata = x._metadata  # type: ignore[attr-defined]
                return copy
            return x
        if type(x) in (list, tuple):
            new_items = [walk(v, depth + 1) for v in x]
            return type(x)(new_items) if any(a is not b for a, b in zip(new_items, x)) else x
        return x

    out = walk(obj)
    if found:
        mapper.dtype(_HALF, asked)
    return out


orig_tensor_to = torch._C.TensorBase.to  # torch's own method (a session patches torch.Tensor.to)
