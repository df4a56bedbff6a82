"""Every use of a private PyTorch API (``torch._C.*``, ``torch._decomp``, dispatcher
internals) lives here, behind small functions with version checks and clear errors,
so that a torch upgrade has one place to look.

Sections are grouped by the layer that needs them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cuda_device_count"]


# --- redirect -----------------------------------------------------------------------
def cuda_device_count() -> int:
    """Real CUDA devices, bypassing any patched ``torch.cuda.device_count``."""
    import torch

    if not torch.backends.cuda.is_built():
        return 0
    return int(torch._C._cuda_getDeviceCount())
