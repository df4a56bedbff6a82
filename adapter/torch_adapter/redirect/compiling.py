"""``torch.compile(mode=...)``: CUDA-graph modes on targets without CUDA graphs.

``mode="reduce-overhead"`` and ``mode="max-autotune"`` turn on CUDA graphs. With the
adapter installed, inductor is told CUDA is available and would try to capture them on
the target, crashing inside CUDA's caching allocator. On a non-CUDA target they become
``"default"`` and ``"max-autotune-no-cudagraphs"`` (the same optimisations without the
capture); each rewrite is logged. ``options={"triton.cudagraphs": True}`` is dropped too.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["MODES", "apply"]

MODES = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def apply(session: Any) -> None:
    if session.target.device_type == "cuda":
        return
    p, log = session.patcher, session.redirect_log
    orig = torch.compile

    @functools.wraps(orig)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
        mode = kwargs.get("mode")
        if mode in MODES:
            log.record("compile", f"torch.compile(mode={mode!r})", f"mode={MODES[mode]!r} (no CUDA graphs on "
                       f"{session.target.device_type})", depth=3)
            kwargs["mode"] = MODES[mode]
        options = kwargs.get("options")
        if isinstance(options, dict) and options.get("triton.cudagraphs"):
            log.record("compile", "torch.compile(options={'triton.cudagraphs': True})", "cudagraphs off", depth=3)
            kwargs["options"] = {k: v for k, v in options.items() if k != "triton.cudagraphs"}
        return orig(model, *args, **kwargs)

    p.set(torch, "compile", compile)
