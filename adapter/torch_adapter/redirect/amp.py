"""AMP: ``autocast("cuda", ...)``, ``GradScaler("cuda")`` and friends on the target.

The AMP dtype policy (``install(amp_dtype=...)``, default ``"auto"``) decides what a
CUDA autocast dtype becomes:

============  ==================================================================
``auto``      the program's own dtype: float16 stays float16 on every target (CPU
              autocast computes float16 too), bfloat16 stays bfloat16. The program's
              float16 weights, its GradScaler and its saved float16 pipelines then meet
              the dtype they were written for (a float16 -> bfloat16 rewrite made
              float16 weights meet bfloat16 activations in ops CPU autocast *promotes*,
              e.g. ``cat``: "Unexpected floating ScalarType in at::autocast::prioritize").
``float16``   always float16 (if the target's autocast accepts it).
``bfloat16``  always bfloat16: the faster choice on a CPU with bf16 units (avx512_bf16,
              AMX; :func:`torch_adapter.optimization.layer.native_low_precision` tells) for a
              program whose weights are float32; float16 weights do not mix with it.
``float32``   autocast is disabled (full precision).
============  ==================================================================

Every rewrite is recorded in the redirect log (``autocast('cuda', float16)`` →
``autocast('cpu', float16) [amp_dtype=auto]``), and :func:`effective_dtype` answers for any request.

Once a CUDA autocast region has been redirected, the norm ops of every autocast region of the
target follow CUDA autocast's rules while the session is installed (checkpoint recomputation
re-enters autocast as ``autocast('cpu')``; see :func:`_install_cuda_norm_rules`): CUDA autocast runs layer_norm, group_norm and
rms_norm in float32, weights included, so float16 weights (``model.half()``) meet a float16 or
bfloat16 input without "mixed dtype (CPU)"; batch_norm (instance_norm goes through it), which CUDA
autocast leaves alone, runs in its weights' dtype as it would on CUDA.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

from ..core import torch_private as tp

__all__ = ["effective_dtype", "apply"]

_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def effective_dtype(policy: str, target_type: str, requested: torch.dtype | None) -> torch.dtype:
    """What ``autocast('cuda', dtype=requested)`` runs with under ``policy`` on ``target_type``."""
    requested = requested if requested is not None else torch.float16
    if policy == "auto":  # the program's own dtype, on every target (module docstring)
        return requested
    return _NAMES[policy]


def apply(session: Any) -> None:
    target_type = session.target.device_type
    if target_type == "cuda":
        return
    _patch_autocast(session, target_type)
    _patch_grad_scaler(session, target_type)
    _patch_custom_fwd(session, target_type)
    _patch_autocast_state(session, target_type)
    # ProfilerActivity.CUDA / use_cuda=True: the target's activity (none extra on the CPU).
    _patch_profiler(session, target_type)
    _patch_sdpa(session, target_type)


def _map_type(device_type: Any, target_type: str) -> Any:
    return target_type if isinstance(device_type, str) and device_type.startswith("cuda") else device_type


def _patch_autocast(session: Any, target_type: str) -> None:
    """``autocast("cuda", dtype)`` becomes the target's autocast in the dtype the AMP policy says."""
    from torch.amp import autocast_mode

    p, log = session.patcher, session.redirect_log

    def policy() -> str:
        return session.config.amp_dtype

    orig_autocast_init = autocast_mode.autocast.__init__

    @functools.wraps(orig_autocast_init)
    def autocast_init(self: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                      cache_enabled: bool | None = None) -> None:
        if isinstance(device_type, str) and device_type.startswith("cuda"):
            new_dtype = effective_dtype(policy(), target_type, dtype)
            why = f"amp_dtype={policy()}"
            mapper = session.device_mapper
            if new_dtype == torch.float16 and policy() == "auto" and mapper.half_as is not None:
                # the dtype policy's float16 (redirect/dtype_policy.py): float16 tensors are float32 here
                new_dtype, why = mapper.half_as, f"amp_dtype=auto; {mapper.half_why}"
            if new_dtype == torch.float32:
                enabled = False
            log.record("amp", f"autocast('cuda', {_short(dtype) if dtype else 'default=float16'})",
                       f"autocast('{target_type}', {_short(new_dtype)}){' disabled' if not enabled else ''}"
                       f" [{why}]", depth=3)
            device_type, dtype = target_type, (new_dtype if enabled else None)
            self._torch_adapter_redirected = enabled
        orig_autocast_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    p.set(autocast_mode.autocast, "__init__", autocast_init)
    _install_cuda_norm_rules(session, autocast_mode.autocast, target_type)


def _patch_grad_scaler(session: Any, target_type: str) -> None:
    from torch.amp import grad_scaler

    p, log = session.patcher, session.redirect_log
    orig_scaler_init = grad_scaler.GradScaler.__init__

    @functools.wraps(orig_scaler_init)
    def scaler_init(self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
        if isinstance(device, str) and device.startswith("cuda"):
            log.record("amp", "GradScaler('cuda')", f"GradScaler('{target_type}')", depth=3)
            device = target_type
        orig_scaler_init(self, device, *args, **kwargs)

    p.set(grad_scaler.GradScaler, "__init__", scaler_init)


def _patch_custom_fwd(session: Any, target_type: str) -> None:
    """``custom_fwd/custom_bwd(device_type="cuda")``: the target's device type."""
    from torch.amp import autocast_mode

    p = session.patcher

    def map_type(device_type: Any) -> Any:
        return _map_type(device_type, target_type)

    orig_fwd, orig_bwd = autocast_mode.custom_fwd, autocast_mode.custom_bwd

    @functools.wraps(orig_fwd)
    def custom_fwd(fwd: Any = None, *, device_type: str, cast_inputs: Any = None) -> Any:
        return orig_fwd(fwd, device_type=map_type(device_type), cast_inputs=cast_inputs)

    @functools.wraps(orig_bwd)
    def custom_bwd(bwd: Any = None, *, device_type: str) -> Any:
        return orig_bwd(bwd, device_type=map_type(device_type))

    for owner in (torch.amp, autocast_mode):  # the module and its re-export (the same functions)
        for name, orig, new in (("custom_fwd", orig_fwd, custom_fwd), ("custom_bwd", orig_bwd, custom_bwd)):
            if getattr(owner, name, None) is orig:
                p.set(owner, name, new)


def _patch_autocast_state(session: Any, target_type: str) -> None:
    """``torch.is_autocast_enabled("cuda")`` and co. take a device type (no argument = CUDA)."""
    p = session.patcher

    def map_type(device_type: Any) -> Any:
        return _map_type(device_type, target_type)

    for name in ("is_autocast_enabled", "get_autocast_dtype", "is_autocast_available"):
        orig = getattr(torch, name, None)
        if orig is None:
            continue

        def make_query(orig: Any, name: str = name) -> Any:
            @functools.wraps(orig)
            def query(device_type: str | None = None) -> Any:
                if name == "get_autocast_dtype" and (device_type is None or str(device_type).startswith("cuda")):
                    return cuda_dtype()
                if device_type is None and name != "is_autocast_available":
                    return orig(target_type)
                return orig(map_type(device_type))

            return query

        p.set(torch, name, make_query(orig))
    orig_dtype, orig_enabled = p.original(torch, "get_autocast_dtype"), p.original(torch, "is_autocast_enabled")

    def cuda_dtype() -> Any:
        """The dtype a CUDA program is told: the target's inside an autocast region; outside one,
        CUDA's default (float16 — what ``autocast("cuda")`` without a dtype then uses here too),
        not the target's own default (bfloat16 for CPU autocast)."""
        if target_type == "cuda" or orig_enabled(target_type):
            return orig_dtype(target_type)
        try:
            return orig_dtype("cuda")
        except RuntimeError:  # a torch without CUDA's autocast state
            return orig_dtype(target_type)
    for name in ("set_autocast_enabled", "set_autocast_dtype"):
        orig = getattr(torch, name, None)
        if orig is None:
            continue

        def make_setter(orig: Any) -> Any:
            # torch's overloads: (device_type, value) and the deprecated (value) meaning CUDA;
            # forwarded as called, with a CUDA device type mapped.
            @functools.wraps(orig)
            def setter(*args: Any, **kwargs: Any) -> Any:
                if "device_type" in kwargs:
                    kwargs["device_type"] = map_type(kwargs["device_type"])
                elif len(args) + len(kwargs) == 2:
                    args = (map_type(args[0]), *args[1:])
                else:
                    return orig(target_type, *args, *kwargs.values())
                return orig(*args, **kwargs)

            return setter

        p.set(torch, name, make_setter(orig))
    if hasattr(torch, "get_autocast_gpu_dtype"):
        p.set(torch, "get_autocast_gpu_dtype", cuda_dtype)


def _short(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _patch_profiler(session: Any, target_type: str) -> None:
    from torch.autograd import profiler as autograd_profiler
    from torch.profiler import ProfilerActivity, profiler as profiler_mod

    p, log = session.patcher, session.redirect_log
    replacement = {"npu": getattr(ProfilerActivity, "PrivateUse1", None), "xpu": getattr(ProfilerActivity, "XPU", None),
                   "mtia": getattr(ProfilerActivity, "MTIA", None)}.get(target_type)
    orig_init = profiler_mod.profile.__init__

    @functools.wraps(orig_init)
    def init(self: Any, *, activities: Any = None, **kwargs: Any) -> None:
        if activities is not None and ProfilerActivity.CUDA in activities:
            activities = [a for a in activities if a != ProfilerActivity.CUDA]
            if replacement is not None and replacement not in activities:
                activities.append(replacement)
            log.record("profiler", "ProfilerActivity.CUDA",
                       str(replacement) if replacement is not None else "CPU activity only", depth=3)
        orig_init(self, activities=activities, **kwargs)

    p.set(profiler_mod.profile, "__init__", init)

    orig_legacy = autograd_profiler.profile.__init__

    @functools.wraps(orig_legacy)
    def legacy_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.pop("use_cuda", False):
            log.record("profiler", "profile(use_cuda=True)", f"use_device={target_type if target_type != 'cpu' else None}",
                       depth=3)
            if target_type != "cpu":
                kwargs["use_device"] = target_type
        if kwargs.get("use_device") == "cuda":
            kwargs["use_device"] = None if target_type == "cpu" else target_type
        orig_legacy(self, *args, **kwargs)

    p.set(autograd_profiler.profile, "__init__", legacy_init)


def _patch_sdpa(session: Any, target_type: str) -> None:
    """sdpa_kernel([FLASH_ATTENTION]) etc.: keep MATH enabled so the target always has a kernel."""
    import torch.nn.attention as attention

    p, log = session.patcher, session.redirect_log
    orig = attention._sdpa_kernel

    def _sdpa_kernel(backends: Any, set_priority: bool = False) -> None:
        backends = list(backends)
        if attention.SDPBackend.MATH not in backends:
            log.record("sdpa", f"sdpa_kernel({[b.name for b in backends]})", "+ MATH (target fallback)", depth=4)
            backends.append(attention.SDPBackend.MATH)
        orig(backends, set_priority)

    p.set(attention, "_sdpa_kernel", _sdpa_kernel)


# --- CUDA autocast's norm rules once CUDA autocast was redirected --------------------------------
# Ops CUDA autocast runs in float32 (its fp32 list; the dispatcher shows AutocastCUDA kernels
# for them) that CPU autocast has no rule for; their C++ kernels reject an input whose
# low-precision dtype differs from the weights' ("mixed dtype (CPU)").
_CUDA_FP32_OPS = ("layer_norm", "native_layer_norm", "group_norm", "rms_norm")
# Ops no autocast casts: they run in the input's dtype, which on CUDA is the user's float16;
# under a float16 -> bfloat16 rewrite the input is cast to the weights' (buffers') dtype.
_WEIGHT_DTYPE_OPS = {"batch_norm": (1, 2, 3, 4)}  # positions of weight, bias, running_mean, running_var
_LOW = (torch.float16, torch.bfloat16)


def _install_cuda_norm_rules(session: Any, autocast_cls: type, target_type: str) -> None:
    """While a redirected ``autocast('cuda')`` region is active on this thread, the target's
    autocast runs :data:`_CUDA_FP32_OPS` in float32 and :data:`_WEIGHT_DTYPE_OPS` in their
    weights' dtype, as CUDA would. The kernels are registered at the target's autocast key on
    the first redirected region (a program that never asks for CUDA autocast never meets them)
    in a ``torch.library.Library`` the session owns and destroys on uninstall. From then on
    they apply to every autocast region of the target while the session is installed: torch
    itself re-enters autocast as ``autocast('cpu')`` when it recomputes a checkpointed block
    (``torch.utils.checkpoint``, diffusers' ``--gradient_checkpointing``), and the recomputed
    block must give the dtypes of the forward pass. After uninstall, plain torch."""
    p = session.patcher
    key = tp.autocast_key(target_type)
    libs: list[Any] = []
    lock = threading.Lock()
    ops = [n for n in (*_CUDA_FP32_OPS, *_WEIGHT_DTYPE_OPS) if not tp.has_kernel_for_key(f"aten::{n}", key)]

    def register() -> None:
        with lock:
            if libs or not ops:
                return
            lib = tp.kernel_library("aten")
            for name in ops:
                kernel = _fp32_kernel if name in _CUDA_FP32_OPS else _weight_dtype_kernel
                tp.register_python_kernel(lib, f"aten::{name}", kernel(name, target_type, key), key)
            libs.append(lib)

    def destroy() -> None:
        with lock:
            for lib in libs:
                lib._destroy()
            libs.clear()

    p.after_restore(destroy)
    orig_enter = autocast_cls.__enter__

    @functools.wraps(orig_enter)
    def enter(self: Any) -> Any:
        result = orig_enter(self)
        if getattr(self, "_torch_adapter_redirected", False):
            register()
        return result

    p.set(autocast_cls, "__enter__", enter)


def _eligible(x: Any, target_type: str) -> bool:
    """What CUDA autocast casts: a floating tensor on the autocast device, float64 excepted."""
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == target_type
            and x.dtype != torch.float64)


def _fp32_kernel(name: str, target_type: str, key: str) -> Any:
    op = getattr(torch.ops.aten, name).default

    def cast(a: Any) -> Any:
        return a.to(torch.float32) if _eligible(a, target_type) else a

    # reached only with the target's autocast on (its key is in the dispatch key set)
    def kernel(_keyset: Any, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}
        with tp.below_autocast(key):
            return op(*args, **kwargs)

    return kernel


def _weight_dtype_kernel(name: str, target_type: str, key: str) -> Any:
    op = getattr(torch.ops.aten, name).default
    positions = _WEIGHT_DTYPE_OPS[name]

    def kernel(_keyset: Any, *args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else None
        if _eligible(x, target_type) and x.dtype in _LOW:
            params = [args[i] for i in positions if i < len(args) and isinstance(args[i], torch.Tensor)]
            if params and params[0].dtype in _LOW and params[0].dtype != x.dtype:
                args = (torch._C.TensorBase.to(x, params[0].dtype), *args[1:])  # not the policy's mapped Tensor.to
        with tp.below_autocast(key):
            return op(*args, **kwargs)

    return kernel
