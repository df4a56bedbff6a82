"""CUDA environment variables → the target's equivalents (table in docs/redirect.md).

Applied at install: where the target has an equivalent and the user has not set it, it
is set (and unset again at uninstall); where it has none, a warning says so once per
variable, naming it. Variables read at device initialisation only take effect in
processes started afterwards (child processes, ``torch-adapter run``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

__all__ = ["EQUIVALENTS", "NO_EFFECT", "AdapterEnvWarning", "apply"]


class AdapterEnvWarning(UserWarning):
    """A CUDA environment variable that has no equivalent on the target."""


# target -> {CUDA variable: target variable}
EQUIVALENTS: dict[str, dict[str, str]] = {
    "npu": {"CUDA_VISIBLE_DEVICES": "ASCEND_RT_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF": "PYTORCH_NPU_ALLOC_CONF",
            "CUDA_LAUNCH_BLOCKING": "ASCEND_LAUNCH_BLOCKING", "NCCL_SOCKET_IFNAME": "HCCL_SOCKET_IFNAME",
            "NCCL_TIMEOUT": "HCCL_CONNECT_TIMEOUT", "NCCL_BUFFSIZE": "HCCL_BUFFSIZE"},
    "xpu": {"CUDA_VISIBLE_DEVICES": "ZE_AFFINITY_MASK", "PYTORCH_CUDA_ALLOC_CONF": "PYTORCH_XPU_ALLOC_CONF",
            "NCCL_SOCKET_IFNAME": "CCL_SOCKET_IFNAME"},
    "mps": {"NCCL_SOCKET_IFNAME": "GLOO_SOCKET_IFNAME"},
    "cpu": {"NCCL_SOCKET_IFNAME": "GLOO_SOCKET_IFNAME"},
}
# Variables that need no equivalent on a target (with the reason shown in the log).
NO_EFFECT: dict[str, dict[str, str]] = {
    "cpu": {"CUDA_LAUNCH_BLOCKING": "CPU ops already run synchronously",
            "CUDA_VISIBLE_DEVICES": "the CPU target has one device",
            "PYTORCH_CUDA_ALLOC_CONF": "no caching allocator on the CPU"},
    "mps": {"CUDA_VISIBLE_DEVICES": "MPS has one device"},
}


def apply(session: Any) -> None:
    target = session.target.device_type
    if target == "cuda":
        return
    p, log = session.patcher, session.redirect_log
    table = EQUIVALENTS.get(target, {})
    quiet = NO_EFFECT.get(target, {})
    unmapped: list[str] = []
    for name in sorted(os.environ):
        if not (name.startswith("CUDA_") or name.startswith("NCCL_") or name == "PYTORCH_CUDA_ALLOC_CONF"):
            continue
        value = os.environ[name]
        if name in table:
            new = table[name]
            if new not in os.environ:
                p.set_env(new, value)
            log.note("env", f"{name}={value}", f"{new}={os.environ[new]}")
        elif name in quiet:
            log.note("env", f"{name}={value}", f"ignored: {quiet[name]}")
        else:
            unmapped.append(name)
            log.note("env", f"{name}={value}", f"no equivalent on {target}")
    if unmapped:
        warnings.warn(
            f"torch_adapter: {', '.join(unmapped)} {'has' if len(unmapped) == 1 else 'have'} no equivalent on "
            f"the {target} target and {'is' if len(unmapped) == 1 else 'are'} ignored. "
            "See docs/redirect.md (environment variables) for the table.",
            AdapterEnvWarning, stacklevel=3)
