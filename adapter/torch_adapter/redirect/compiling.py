"""``torch.compile(mode=...)``: CUDA-graph modes on targets without CUDA graphs.

``mode="reduce-overhead"`` and ``mode="max-autotune"`` turn on CUDA graphs. With the
adapter installed, inductor is told CUDA is available and would try to capture them on
the target, crashing inside CUDA's caching allocator. On a non-CUDA target they become
``"default"`` and ``"max-autotune-no-cudagraphs"`` (the same optimisations without the
capture); each rewrite is logged. ``options={"triton.cudagraphs": True}`` is dropped too.

**Dynamo's tables of torch's functions.** torch._dynamo looks torch's functions up by name
once, at its first use (``_torch_private.dynamo_tables``). Built while the adapter's wrappers
stand in for ``torch.arange`` & co., they would hold the wrappers: dynamo would then refuse to
trace the real functions the wrappers call — a graph break at every factory call and
``Tensor.to`` in compiled code, during the session and after ``uninstall()``. So
:func:`prepare` (before any patch) builds them from torch's own functions when torch._dynamo
is already imported; otherwise the first ``torch.compile`` of the session builds them with
the patches suspended for that moment. At uninstall, tables that picked up a wrapper anyway
(built by another path during the session) are forgotten, to be rebuilt from torch's own.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .. import _torch_private as tp

__all__ = ["MODES", "prepare", "apply"]

MODES = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def prepare(session: Any) -> None:
    """Before any patch: dynamo's tables from torch's own functions (module docstring)."""
    if session.target.device_type == "cuda":
        return
    tp.build_dynamo_tables()  # nothing when torch._dynamo is not imported
    session.patcher.before_restore(lambda values: tp.forget_dynamo_tables({id(v) for v in values}))


def apply(session: Any) -> None:
    if session.target.device_type == "cuda":
        return
    p, log = session.patcher, session.redirect_log
    orig = torch.compile

    @functools.wraps(orig)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
        if not tp.dynamo_tables_ready():
            import torch._dynamo  # noqa: F401 - what torch.compile imports; its tables are built below

            with p.suspended():  # torch's own functions for this moment (module docstring)
                tp.build_dynamo_tables()
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
