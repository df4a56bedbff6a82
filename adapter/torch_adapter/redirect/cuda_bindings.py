"""The private ``torch._C._cuda_*`` stream/device bindings, answered for the target.

A CPU build of torch lacks them, yet code written for CUDA calls a few directly, bypassing
``torch.cuda``: PyTorch's own CUDA test base (``common_utils.CudaNonDefaultStream``) runs every
CUDA test on a fresh non-default stream through ``torch._C._cuda_setStream`` and
``_cuda_setDevice``, and clears cuBLAS workspaces with ``_cuda_clearCublasWorkspaces``. While
installed on a target without CUDA, each binding in :data:`BINDINGS` that torch lacks is set
on ``torch._C`` and answers with the target's semantics (on the CPU target: one synchronous
stream, so selecting any stream is exact; a logical device index). Bindings torch already has
are left alone, and every one is removed at uninstall.

Audited (2026-12, the installed bitsandbytes, DeepSpeed, accelerate, transformers, diffusers,
Lightning, torchmetrics; ``grep torch._C._cuda_``): bitsandbytes binds ``_cuda_getCurrentRawStream``
at import and calls it per CUDA kernel; Lightning calls ``_cuda_clearCublasWorkspaces``; accelerate's
notebook checks ``_cuda_isInBadFork`` — each answered here; the others call none.

Deliberately *not* answered: ``_cuda_getDeviceCount`` — ``torch.cuda._is_compiled()`` tests
for it, and answering it would make torch's own Python take CUDA-build paths that call
bindings which do not exist (docs/cuda-namespace.md, "Private bindings").
"""

from __future__ import annotations

from typing import Any, Callable

from ..core import torch_private as tp
from . import host_memory

__all__ = ["BINDINGS", "apply", "bindings", "bindings_markdown"]

# name -> what it does while installed (data; docs/cuda-namespace.md lists it)
BINDINGS: dict[str, str] = {
    "_cuda_setStream": "selects the target's stream (CPU: the one synchronous stream)",
    "_cuda_getCurrentStream": "(stream_id, device_index, device_type) of the current stream",
    "_cuda_getDefaultStream": "(stream_id, device_index, device_type) of the default stream",
    "_cuda_setDevice": "sets the logical CUDA index (as torch.cuda.set_device)",
    "_cuda_getDevice": "the logical CUDA index",
    "_cuda_exchangeDevice": "sets the logical index, returns the previous one",
    "_cuda_maybeExchangeDevice": "as _cuda_exchangeDevice",
    "_cuda_synchronize": "the target's synchronize (no-op on the CPU)",
    "_cuda_emptyCache": "as torch.cuda.empty_cache",
    "_cuda_clearCublasWorkspaces": "no-op (no cuBLAS workspaces)",
    "_cuda_resetCublasWorkspaceSize": "no-op",
    "_cuda_resetCublasLtWorkspaceSize": "no-op",
    "_cuda_cudaCachingAllocator_is_enabled": "False (no CUDA caching allocator: tests that need one skip)",
    # bitsandbytes binds it at import (bitsandbytes/backends/cuda/ops.py, `import bitsandbytes` with
    # torch.cuda.is_available() True) to hand CUDA kernels their stream; those kernels are registered for
    # CUDA tensors only, so on the target the raw stream is never passed to one
    "_cuda_getCurrentRawStream": "the current stream's handle: 0 (the target's one stream; no cudaStream_t)",
    # accelerate's notebook launcher checks asserts it before forking ranks
    "_cuda_isInBadFork": "False (no CUDA context a fork could break)",
}


def _stream_tuple(stream: Any) -> tuple[int, int, int]:
    return (int(getattr(stream, "stream_id", 0)), int(getattr(stream, "device_index", 0)),
            int(getattr(stream, "device_type", 0)))


def bindings(session: Any) -> dict[str, Callable[..., Any]]:
    """The stand-ins, built over the session's ``torch.cuda`` stand-in and device mapper."""
    import torch

    m = session.device_mapper

    def set_stream(stream_id: int = 0, device_index: int = 0, device_type: int = 0) -> None:
        if not m.on_cpu:  # a real target: select its stream by the same triple
            torch.cuda.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                               device_type=device_type))

    def set_device(index: int) -> None:
        torch.cuda.set_device(int(index))

    def exchange(index: int) -> int:
        prev = torch.cuda.current_device()
        if index >= 0:
            torch.cuda.set_device(int(index))
        return prev

    return {
        "_cuda_setStream": set_stream,
        "_cuda_getCurrentStream": lambda device_index=0: _stream_tuple(torch.cuda.current_stream()),
        "_cuda_getDefaultStream": lambda device_index=0: _stream_tuple(torch.cuda.default_stream()),
        "_cuda_setDevice": set_device,
        "_cuda_getDevice": lambda: torch.cuda.current_device(),
        "_cuda_exchangeDevice": exchange,
        "_cuda_maybeExchangeDevice": exchange,
        "_cuda_synchronize": lambda: torch.cuda.synchronize(),
        "_cuda_emptyCache": lambda: host_memory.empty_cache(),
        "_cuda_clearCublasWorkspaces": lambda: None,
        "_cuda_resetCublasWorkspaceSize": lambda: None,
        "_cuda_resetCublasLtWorkspaceSize": lambda: None,
        "_cuda_cudaCachingAllocator_is_enabled": lambda: False,
        "_cuda_getCurrentRawStream": lambda device_index=0: 0,
        "_cuda_isInBadFork": lambda: False,
    }


def apply(session: Any) -> None:
    """Set each missing binding on ``torch._C`` for the session (none on a CUDA target)."""
    if session.target.device_type == "cuda":
        return
    mod = tp.cuda_binding_module()
    for name, fn in bindings(session).items():
        if not hasattr(mod, name):
            fn.__name__ = fn.__qualname__ = name
            session.patcher.set(mod, name, fn)


def bindings_markdown() -> str:
    """The "Private bindings" section of docs/cuda-namespace.md."""
    lines = [
        "## Private bindings (`torch._C._cuda_*`)\n",
        "Code written for CUDA sometimes calls torch's private CUDA bindings directly. PyTorch's own CUDA",
        "test base does for every test: `CudaNonDefaultStream` selects a fresh non-default stream with",
        "`torch._C._cuda_setStream(stream_id=..., device_index=..., device_type=...)` and restores the device",
        "with `_cuda_setDevice`; the memory-leak check calls `_cuda_clearCublasWorkspaces`. A CPU build has",
        "none of them, so unanswered the whole CUDA suite fails on that line. While installed on a target",
        "without CUDA, each binding below that torch lacks is set on `torch._C` (removed at uninstall).",
        "The policy they express is kept: on the CPU target there is one synchronous stream, so *any* stream",
        "the program selects is the stream its ops run on, in order — selecting it is exact, not ignored.",
        "Not answered, on purpose: `_cuda_getDeviceCount`, because `torch.cuda._is_compiled()` tests for it",
        "and torch's own Python would then take CUDA-build paths into bindings that do not exist; the",
        "allocator, jiterator and TunableOp bindings, which `torch.cuda`'s stand-ins answer one level up.\n",
        "| binding | while installed |", "|---|---|",
    ]
    lines += [f"| `torch._C.{name}` | {what} |" for name, what in BINDINGS.items()]
    return "\n".join(lines) + "\n"
