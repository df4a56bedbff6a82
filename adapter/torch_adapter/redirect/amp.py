"""AMP: ``autocast("cuda", ...)``, ``GradScaler("cuda")`` and friends on the target.

The AMP dtype policy (``install(amp_dtype=...)``, default ``"auto"``) decides what a
CUDA autocast dtype becomes:

============  ==================================================================
``auto``      float16 stays float16 where the target computes it natively (cuda, npu,
              xpu, mps); on the CPU it becomes bfloat16 (CPU float16 matmuls are
              emulated on most processors and CPU autocast's own default is bf16).
``float16``   always float16 (if the target's autocast accepts it).
``bfloat16``  always bfloat16.
``float32``   autocast is disabled (full precision).
============  ==================================================================

Every rewrite is recorded in the redirect log (``autocast('cuda', float16)`` →
``autocast('cpu', bfloat16)``), and :func:`effective_dtype` answers for any request.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["effective_dtype", "apply"]

_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def effective_dtype(policy: str, target_type: str, requested: torch.dtype | None) -> torch.dtype:
    """What ``autocast('cuda', dtype=requested)`` runs with under ``policy`` on ``target_type``."""
    requested = requested if requested is not None else torch.float16
    if policy == "auto":
        if target_type == "cpu" and requested == torch.float16:
            return torch.bfloat16
        return requested
    return _NAMES[policy]


def apply(session: Any) -> None:
    target_type = session.target.device_type
    if target_type == "cuda":
        return
    p = session.patcher
    log = session.redirect_log
    from torch.amp import autocast_mode, grad_scaler

    def policy() -> str:
        return session.config.amp_dtype

    orig_autocast_init = autocast_mode.autocast.__init__

    @functools.wraps(orig_autocast_init)
    def autocast_init(self: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                      cache_enabled: bool | None = None) -> None:
        if isinstance(device_type, str) and device_type.startswith("cuda"):
            new_dtype = effective_dtype(policy(), target_type, dtype)
            if new_dtype == torch.float32:
                enabled = False
            log.record("amp", f"autocast('cuda', {_short(dtype) if dtype else 'default=float16'})",
                       f"autocast('{target_type}', {_short(new_dtype)}){' disabled' if not enabled else ''}"
                       f" [amp_dtype={policy()}]", depth=3)
            device_type, dtype = target_type, (new_dtype if enabled else None)
        orig_autocast_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    p.set(autocast_mode.autocast, "__init__", autocast_init)

    orig_scaler_init = grad_scaler.GradScaler.__init__

    @functools.wraps(orig_scaler_init)
    def scaler_init(self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
        if isinstance(device, str) and device.startswith("cuda"):
            log.record("amp", "GradScaler('cuda')", f"GradScaler('{target_type}')", depth=3)
            device = target_type
        orig_scaler_init(self, device, *args, **kwargs)

    p.set(grad_scaler.GradScaler, "__init__", scaler_init)

    def map_type(device_type: Any) -> Any:
        return target_type if isinstance(device_type, str) and device_type.startswith("cuda") else device_type

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

    # torch.is_autocast_enabled("cuda") and co. take a device type (no argument = CUDA).
    for name in ("is_autocast_enabled", "get_autocast_dtype", "is_autocast_available"):
        orig = getattr(torch, name, None)
        if orig is None:
            continue

        def make_query(orig: Any, name: str = name) -> Any:
            @functools.wraps(orig)
            def query(device_type: str | None = None) -> Any:
                if device_type is None and name != "is_autocast_available":
                    return orig(target_type)
                return orig(map_type(device_type))

            return query

        p.set(torch, name, make_query(orig))
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
        p.set(torch, "get_autocast_gpu_dtype", lambda: torch.get_autocast_dtype(target_type))

    # ProfilerActivity.CUDA / use_cuda=True: the target's activity (none extra on the CPU).
    _patch_profiler(session, target_type)
    _patch_sdpa(session, target_type)


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
