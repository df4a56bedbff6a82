"""The ``check`` command's constants that its argument parser needs: kept apart from the scanner so
that building ``torch-adapter``'s parser (every sub-command, ``run`` included) imports no scanner code."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_SIZE", "TARGET_NAMES"]

DEFAULT_MAX_SIZE = 4 * 1024 * 1024  # bytes; larger files are noted and skipped
TARGET_NAMES = ("any", "cpu", "cuda", "npu", "xpu", "mps", "mtia")
