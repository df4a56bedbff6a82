"""Targets: where CUDA-written code is meant to run, and what this machine has.

A :class:`Target` names the backend (``cuda``, ``npu``, ``xpu``, ``mps``, ``cpu``), the torch
device type that really executes, the dispatch key whose kernels count as native, and the
collective backend that replaces NCCL. ``detect()`` probes this machine once (cached);
``resolve()`` turns the user's ``target=`` into a Target or a clear error.

Simulated targets (``simulate=True``) keep the *name* and capability profile of another
backend but execute on the host's best real device; their op tables come from
:mod:`torch_adapter.routing` (read lazily, so listing real targets stays cheap).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import TargetError, did_you_mean, format_error

__all__ = ["Target", "KNOWN", "AUTO_ORDER", "detect", "resolve", "targets", "describe", "cpu_details"]

# name -> (device type, dispatch key, collective backend)
KNOWN: dict[str, tuple[str, str, str]] = {
    "cuda": ("cuda", "CUDA", "nccl"),
    "npu": ("npu", "PrivateUse1", "hccl"),
    "xpu": ("xpu", "XPU", "xccl"),
    "mps": ("mps", "MPS", "gloo"),
    "mtia": ("mtia", "MTIA", "gloo"),
    "cpu": ("cpu", "CPU", "gloo"),
}
# install(target="auto") takes the first present one.
AUTO_ORDER = ("cuda", "npu", "xpu", "mps", "cpu")


@dataclass(frozen=True)
class Target:
    """A backend as the adapter uses it."""

    name: str
    device_type: str  # the torch device type tensors really live on
    dispatch_key: str  # whose kernels count as native
    dist_backend: str  # what "nccl" becomes
    present: bool = True
    simulated: bool = False
    device_count: int = 1
    emulated: bool = False  # an emulated device of the project's own (torch_adapter/emulated)
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def label(self) -> str:
        if self.simulated:
            return f"{self.name} (simulated on {self.device_type})"
        return f"{self.name} (emulated)" if self.emulated else self.name

    def device(self, index: int | None = None) -> Any:
        """The torch.device that a CUDA device index becomes on this target."""
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        if index is None:
            return torch.device(self.device_type)
        return torch.device(self.device_type, index)


def _probe_cuda() -> tuple[bool, int, dict[str, Any]]:
    import torch

    if not torch.backends.cuda.is_built():
        return False, 0, {"reason": "this torch build has no CUDA"}
    count = int(torch._C._cuda_getDeviceCount())
    if count <= 0:
        return False, 0, {"reason": "no CUDA device visible"}
    hip = getattr(torch.version, "hip", None)
    names = [torch._C._cuda_getDeviceProperties(i).name for i in range(count)] if hasattr(
        torch._C, "_cuda_getDeviceProperties") else []
    return True, count, {"runtime": f"ROCm {hip}" if hip else f"CUDA {torch.version.cuda}", "devices": names}


def _probe_npu() -> tuple[bool, int, dict[str, Any]]:
    if importlib.util.find_spec("torch_npu") is None:
        return False, 0, {"reason": "torch_npu is not installed"}
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    if getattr(torch_npu, "__torch_adapter_emulated__", False):  # emulated/vendor_package.py's stand-in
        return False, 0, {"reason": "torch_npu here is the emulated npu's (install(target='npu', emulate=True))"}
    if not torch.npu.is_available():
        return False, 0, {"reason": "torch_npu found no NPU"}
    return True, int(torch.npu.device_count()), {"runtime": f"torch_npu {torch_npu.__version__}"}


def _probe_xpu() -> tuple[bool, int, dict[str, Any]]:
    import torch

    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return False, 0, {"reason": "no XPU device (torch.xpu.is_available() is False)"}
    return True, int(xpu.device_count()), {}


def _probe_mps() -> tuple[bool, int, dict[str, Any]]:
    import torch

    if not torch.backends.mps.is_available():
        return False, 0, {"reason": "MPS is only on Apple silicon macOS builds"}
    return True, 1, {}


def _probe_mtia() -> tuple[bool, int, dict[str, Any]]:
    import torch

    mtia = getattr(torch, "mtia", None)
    try:
        ok = bool(mtia is not None and mtia.is_available())
    except Exception:  # MTIA probes raise on builds without it
        ok = False
    return (ok, int(mtia.device_count()) if ok else 0,
            {} if ok else {"reason": "no MTIA device"})


def cpu_details() -> dict[str, Any]:
    """The CPU's low-precision capability (core/cpu_features.py), flat for a table row; read now, so a
    forced kind (``TORCH_ADAPTER_CPU_FEATURES``, ``cpu_features.forced``) shows."""
    from ..core.cpu_features import cpu_features

    from ..core.config import float16_tensors
    from ..core.cpu_speed import attention_compute, float16_compute
    from .internal import internal

    f = cpu_features()
    with internal():  # (the flags' choice, checked by one cached measurement where it is bfloat16)
        chosen, _why = float16_compute()
        attention, _ = attention_compute()
    measured = chosen != f.float16_compute()[0]  # the check overruled the flags
    attention_measured = attention != f.attention_compute()[0] and not measured
    return {"cpu_kind": f.kind, "vector_bits": f.vector_bits, "bf16_units": ",".join(f.bf16_units) or "none",
            "fp16_units": ",".join(f.fp16_units) or "none", "amx": ",".join(f.amx) or "none",
            "float16_compute": chosen + (" (bfloat16 measured slower)" if measured else ""),
            "float16_attention": attention + (f" (bfloat16 measured {'faster' if attention == 'bfloat16' else 'slower'})"
                                              if attention_measured else ""),
            "float16_tensors": float16_tensors("auto", chosen) + " under dtype_policy='auto' (the default)",
            "float16_gate": _gate_state(), "features_from": f.source}


def _gate_state() -> str:
    """Who tests the heavy ops' dtype on a CPU session: the C++ gate when built, else Python (routing/half_gate.py)."""
    import os

    from . import half_gate

    if os.environ.get(half_gate.ENV) == "python":
        return f"python ({half_gate.ENV}=python)"
    return "cpp" if half_gate.is_built() else "python (the first CPU session builds the C++ gate in the background)"


def _probe_cpu() -> tuple[bool, int, dict[str, Any]]:
    import torch

    return True, 1, {
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
    }


_PROBES = {
    "cuda": _probe_cuda,
    "npu": _probe_npu,
    "xpu": _probe_xpu,
    "mps": _probe_mps,
    "mtia": _probe_mtia,
    "cpu": _probe_cpu,
}


@functools.lru_cache(maxsize=None)
def _detect_one(name: str) -> Target:
    device_type, key, backend = KNOWN[name]
    try:
        present, count, details = _PROBES[name]()
    except Exception as exc:  # a vendor probe that crashes means: not usable here
        present, count, details = False, 0, {"reason": f"probe failed: {type(exc).__name__}: {exc}"}
    return Target(name, device_type, key, backend, present=present, simulated=False,
                  device_count=count, details=details)


def detect() -> list[Target]:
    """Every known backend, present or not, probed once per process."""
    return [_detect_one(name) for name in KNOWN]


def _present_names() -> list[str]:
    return [t.name for t in detect() if t.present]


def resolve(target: str | Target = "auto", *, simulate: bool = False, emulate: bool = False) -> Target:
    """Turn ``install(target=...)`` into a Target, or raise TargetError saying what is here.
    ``emulate=True`` starts the emulated device of that name (torch_adapter/emulated)."""
    if isinstance(target, Target):
        return target
    if emulate:
        return _emulated(target, simulate)
    if not isinstance(target, str):
        raise TargetError(format_error(
            "torch_adapter.install(target=...)", 'a target name such as "auto", "cpu", "npu"',
            f"{target!r} ({type(target).__name__})", fix='pass a string, e.g. target="auto"'))
    name = target.strip().lower()
    if name == "host":
        name = "auto"
    if name == "auto":
        if simulate:
            raise TargetError(format_error(
                "torch_adapter.install(target='auto', simulate=True)",
                "a named target to simulate", "'auto'",
                why="simulation previews another backend; 'auto' means the one this machine has",
                fix='name one, e.g. install(target="mps", simulate=True)'))
        for candidate in AUTO_ORDER:
            t = _detect_one(candidate)
            if t.present:
                return t
        raise TargetError("no target is present, not even the CPU")  # pragma: no cover
    if name.endswith(".toml") or (simulate and name not in KNOWN):
        return _simulated(target.strip())  # a path keeps its spelling (Good.toml is not good.toml)
    if name not in KNOWN:
        raise TargetError(format_error(
            "torch_adapter.install(target=...)",
            f"one of {', '.join(['auto', *KNOWN])} (or a profile .toml with simulate=True)",
            repr(target) + did_you_mean(name, ["auto", *KNOWN]), why="that is not a backend torch_adapter knows",
            fix=f"use one of the targets present here: {', '.join(_present_names())}"))
    if simulate:
        return _simulated(name)
    t = _detect_one(name)
    if not t.present:
        from ..core.callsite import running_as
        from ..errors import target_call, target_choice

        where = running_as()
        emulatable = ""
        from ..emulated import EMULATABLE

        if name in EMULATABLE:
            emulatable = f", or execute it on the emulated {name} with {target_choice(name, where, emulate=True)}"
        raise TargetError(format_error(
            target_call(name, where), "a target present on this machine",
            f"{name!r}, which is absent ({t.details.get('reason', 'not found')})",
            why="redirection needs the backend's device to run on",
            fix=(f"use one of: {', '.join(target_choice(n, where) for n in _present_names())}; or preview {name}'s "
                 f"routing with {target_choice(name, where, simulate=True)}{emulatable}")))
    return t


def _emulated(target: Any, simulate: bool) -> Target:
    """The emulated device named ``target``: started (built once per torch, cached) on first use."""
    from .. import emulated

    call = f"torch_adapter.install(target={target!r}, emulate=True)"
    if simulate:
        raise TargetError(format_error(call + " with simulate=True", "emulate or simulate, not both", "both",
                                       why="an emulated device executes the target's routing; a simulated one "
                                           "only labels host execution with it",
                                       fix=f"drop simulate=True (install(target={target!r}, emulate=True))"))
    name = target.strip().lower() if isinstance(target, str) else target
    if not isinstance(name, str) or name in ("auto", "host"):
        raise TargetError(format_error(call, f"a target that can be emulated: {', '.join(emulated.EMULATABLE)}",
                                       repr(target), why="emulate=True names the device to emulate",
                                       fix="install(target='npu', emulate=True)"))
    emulated.check_emulatable(name)
    from . import profiles

    profile = profiles.load_profile(name)
    em = emulated.start(name, profile.native, device_count=_local_devices())
    device_type, key, backend = KNOWN[name]
    return Target(name, device_type, key, backend, present=True, simulated=False, emulated=True,
                  device_count=em.device_count,
                  details={"runtime": "torch_adapter emulated device (PrivateUse1, host memory)",
                           "profile": profile.source, "device_kernels": len(em.kernels),
                           "native_ops": profile.native_count})


def _local_devices() -> int:
    """Devices an emulated target starts with: one, or one per local rank under a launcher."""
    from ..core.launcher_env import local_world_size  # LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, ...

    return local_world_size()


def _simulated(name: str) -> Target:
    """A simulated target: the named profile, executing on the host's best real device."""
    from . import profiles  # lazy: op tables are read only when simulating

    profile = profiles.load_profile(name)
    host = resolve("auto")
    return replace(host, name=profile.name, dispatch_key=profile.dispatch_key or host.dispatch_key,
                   simulated=True, details={**host.details, "profile": profile.source,
                                            "native_ops": profile.native_count})


def targets(*, simulated: bool = True) -> list[dict[str, Any]]:
    """What this machine has: one row per real backend, then the simulated ones.

    Each row: ``name``, ``present``, ``simulated``, ``device`` (torch device type that
    executes), ``devices`` (count), ``dist_backend`` and ``details``; simulated rows also
    carry ``native_ops``/``composite_ops`` counts from their op table.
    """
    rows: list[dict[str, Any]] = []
    for t in detect():
        details = {**t.details, **cpu_details()} if t.name == "cpu" else dict(t.details)
        rows.append({"name": t.name, "present": t.present, "simulated": False,
                     "device": t.device_type, "devices": t.device_count,
                     "dist_backend": t.dist_backend, "details": details})
    if simulated:
        rows.extend(emulated_rows())
        try:
            from . import profiles
        except ImportError:  # pragma: no cover - routing is part of the package
            return rows
        rows.extend(profiles.simulated_rows(resolve("auto")))
    return rows


def emulated_rows() -> list[dict[str, Any]]:
    """One row per target that can be emulated here (torch_adapter/emulated): present where a C++
    compiler can build the device (or it is built), with how to start it."""
    from .. import emulated
    from ..core.torch_private import can_build_extensions

    rows: list[dict[str, Any]] = []
    for name, what in emulated.EMULATABLE.items():
        running = emulated.active()
        built = emulated.is_built()
        present = built or can_build_extensions()
        device_type, _key, backend = KNOWN[name]
        rows.append({"name": name, "present": present, "simulated": False, "emulated": True,
                     "device": device_type, "devices": running.device_count if running else 1,
                     "dist_backend": backend,
                     "details": {"note": f"{what}; install(target={name!r}, emulate=True)",
                                 "built": "yes" if built else "no (python -m torch_adapter.emulated build)",
                                 "running": "yes" if running is not None and running.name == name else "no"}})
    return rows


def describe(target: str | Target = "auto", *, simulate: bool = False) -> dict[str, Any]:
    """One target's row (see :func:`targets`)."""
    t = resolve(target, simulate=simulate)
    details = {**t.details, **cpu_details()} if t.device_type == "cpu" else dict(t.details)
    return {"name": t.name, "present": t.present, "simulated": t.simulated, "emulated": t.emulated,
            "device": t.device_type,
            "devices": t.device_count, "dist_backend": t.dist_backend,
            "dispatch_key": t.dispatch_key, "details": details}
