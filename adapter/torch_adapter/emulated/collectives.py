"""The emulated device's collective backend (``hccl``): torch.distributed on its tensors."""

from __future__ import annotations


def register(name: str) -> None:
    """Register the collective backend of the emulated ``name``."""
