"""``torch.accelerator`` answered for the CPU target, to the program (torch itself keeps the truth).

Device-agnostic programs ask ``torch.accelerator`` instead of ``torch.cuda``: pytorch/examples'
FSDP2 and tensor-parallel scripts refuse to start without one ("Unable to locate sufficient
2 gpus"), others call ``current_accelerator().type`` with no ``None`` check, and the rest
quietly take a CPU path the adapter never sees. On a CPU-only torch the namespace says
"none" while ``torch.cuda`` (answered by :mod:`.cuda_ns`) says "one CUDA device": the
program gets two contradicting pictures of the machine.

While the target is the CPU, the names below answer as ``torch.cuda`` does — the
current accelerator is ``cuda``, its count, index, streams and memory figures are
``torch.cuda``'s stand-ins — **for every caller outside torch**. torch's own modules consult
``torch.accelerator`` to choose host or device code (the optimizer's fused defaults,
``parallel_apply``, c10d's ``device_id`` check, ``torch.load``'s device restore): a call
whose caller is a ``torch`` module gets torch's own function, so those paths see the real
tensors' machine, exactly as without the adapter. PyTorch's test helpers
(``torch.testing._internal``, shipped in the wheel) are the program's side: they are written for
the tests' CUDA classes (``largeTensorTest`` sizes a "cuda" test by the accelerator's memory only
when the accelerator is named ``cuda``).

On an accelerator target (npu, xpu, mps) ``torch.accelerator`` already counts, selects and
synchronises the target's devices, and keeps doing so; only ``current_accelerator()`` answers
the program ``cuda``, as on the CPU target: a CUDA-written program that asks it branches on
``.type == "cuda"`` (pytorch/examples' imagenet ``main_worker`` moves its model to the device
and wraps it in DDP only then; on the emulated npu it left the model on the host and failed with
"weight is on cpu"), and every device it then names ``cuda`` is mapped to the target. On the
``cuda`` target nothing is patched.

**Who the caller is.** The nearest frame that is not a pass-through decides: frames of the
modules in :data:`PASS_THROUGH` only carry a call on behalf of whoever made it — torch's
decorator wrappers (``torch.no_grad()(fn)``, ``torch.inference_mode()(fn)``,
``torch.compiler.disable(fn)``) and the standard library's call plumbing (``functools``,
``contextlib``, ``threading``) — so ``torch.no_grad()(torch.accelerator.current_accelerator)()``
is the program's call. No frame at all (an ``atexit`` callback, a C callback) is the program's
too. ``functools.partial`` and ``map`` are C and add no frame. The walk reads one dict entry per
frame; most calls stop at the first.

**Compiled code.** Frames cannot be inspected in code dynamo traces, so there the answer is
the compiled program's, as a constant: ``torch.compiler.is_dynamo_compiling()`` (False when
running, folded to True when traced) selects it. torch code that dynamo inlines into the
program's graph (``flex_attention``'s default device) gets the program's answer as well; torch's
code that runs while compiling (fake tensors, inductor) runs, and gets torch's.

The patches are set on ``torch.accelerator`` and on the submodule that defines each name
(``torch.accelerator.memory``), by import path; ``uninstall()`` restores both.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable

import torch
from torch.compiler import is_dynamo_compiling as _traced  # False when run, True where dynamo traces

from ..core.patching import STAND_IN, mark_stand_in

__all__ = ["ANSWERS", "PASS_THROUGH", "apply", "accelerator_markdown"]

# Modules whose frames only carry a call on behalf of their caller (module docstring).
PASS_THROUGH = frozenset({
    "functools", "contextlib", "threading", "concurrent.futures.thread", "weakref",
    "torch.utils._contextlib",  # no_grad / enable_grad / inference_mode / set_grad_enabled as decorators
    "torch.autograd.grad_mode",
    "torch._dynamo.eval_frame",  # torch.compiler.disable(fn), torch.compile(fn)'s entry
    "torch._compile",  # torch._disable_dynamo
})

# PyTorch's test helpers (shipped in the wheel, not torch's machinery): answered as the program
TEST_HELPERS = "torch.testing._internal"

# torch.accelerator name -> the torch.cuda name whose (stand-in) answer it gives; None: its own below
ANSWERS: dict[str, str | None] = {
    "is_available": "is_available",
    "current_accelerator": None,
    "device_count": "device_count",
    "current_device_index": "current_device",
    "current_device_idx": "current_device",
    "set_device_index": "set_device",
    "set_device_idx": "set_device",
    "device_index": None,
    "synchronize": "synchronize",
    "current_stream": "current_stream",
    "set_stream": "set_stream",
    "empty_cache": "empty_cache",
    "get_memory_info": "mem_get_info",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
}


def accelerator_markdown() -> str:
    """docs/cuda-namespace.md's ``torch.accelerator`` section (a test keeps it in sync)."""
    lines = ["## `torch.accelerator` on the CPU target\n",
             "Device-agnostic code asks `torch.accelerator`; on the CPU target the program gets the answers",
             "`torch.cuda` gives (the current accelerator is `cuda`, one device per local rank under a launcher),",
             "so it takes its accelerator path, which the adapter redirects. A call made by torch's own modules",
             "(the optimizer, `parallel_apply`, c10d, `torch.load`) gets torch's answer, so torch's host/device",
             "choices stay those of the real machine. The caller is the nearest frame past pass-through ones:",
             "torch's decorator wrappers (`torch.no_grad()(fn)`, `torch.inference_mode()(fn)`,",
             "`torch.compiler.disable(fn)`) and `functools`/`contextlib`/`threading` carry the call of whoever",
             "made it; no frame at all (an `atexit` callback) is the program. In code `torch.compile` traces",
             "the answer is the compiled program's, a constant in the graph (no graph break). On accelerator",
             "targets (npu, xpu, mps) only `current_accelerator` is answered (`cuda`, the program's name; the",
             "devices are torch's own); on the cuda target nothing is patched.\n",
             "| name | answered as |", "|---|---|"]
    for name, cuda_name in ANSWERS.items():
        how = {"current_accelerator": "`torch.device(\"cuda\")`",
               "device_index": "`torch.cuda.device(i)` (a context manager; `None`: no change)"}.get(name)
        lines.append(f"| `torch.accelerator.{name}` | {how or f'`torch.cuda.{cuda_name}`'} |")
    return "\n".join(lines) + "\n"


def _torch_caller() -> bool:
    """Whether the stand-in calling this was called by torch's own code: the nearest frame past
    its caller's pass-through frames decides (module docstring); none at all is the program."""
    frame = sys._getframe(1).f_back  # the stand-in's caller; None when called from no Python frame
    while frame is not None:
        name = frame.f_globals.get("__name__") or ""
        if name not in PASS_THROUGH:
            # torch.testing._internal is PyTorch's test suite's helpers: code written for the tests' CUDA
            # classes (largeTensorTest asks current_accelerator() whether the "cuda" device is the accelerator,
            # and skips by its memory only then), so it is the program's side
            return (name == "torch" or name.startswith("torch.")) and not name.startswith(TEST_HELPERS)
        frame = frame.f_back
    return False


def _stand_in(name: str, original: Callable[..., Any], answer: Callable[..., Any], log: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def stand_in(*args: Any, **kwargs: Any) -> Any:
        if _traced():  # dynamo is tracing the program: its answer, a constant in the graph
            return answer(*args, **kwargs)
        if _torch_caller():
            return original(*args, **kwargs)
        log.record("namespace", f"torch.accelerator.{name}", "torch.cuda's answer for the target", depth=3)
        return answer(*args, **kwargs)

    stand_in.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    return mark_stand_in(stand_in, original)


def _via_cuda(cuda_name: str) -> Callable[..., Any]:
    def answer(*args: Any, **kwargs: Any) -> Any:
        return getattr(torch.cuda, cuda_name)(*args, **kwargs)  # looked up now: the session's stand-in
    return answer


def _current_accelerator(check_available: bool = False) -> Any:
    return torch.device("cuda")


def _device_index_class(original: type, log: Any) -> type:
    """``with torch.accelerator.device_index(i):`` — torch.cuda.device's logical index for the program."""

    class _Meta(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, original)

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            if _torch_caller():
                return original(*args, **kwargs)
            log.record("namespace", "torch.accelerator.device_index", "torch.cuda.device (logical index)", depth=3)
            return _DeviceIndex(*args, **kwargs)

    class _DeviceIndex:
        def __init__(self, device: int | None, /) -> None:
            self.ctx = torch.cuda.device(device) if device is not None else None

        def __enter__(self) -> None:
            if self.ctx is not None:
                self.ctx.__enter__()

        def __exit__(self, *exc: Any) -> None:
            if self.ctx is not None:
                self.ctx.__exit__(*exc)

    return _Meta("device_index", (), {"__module__": "torch.accelerator", "__doc__": original.__doc__,
                                      STAND_IN: original,
                                      "__signature__": inspect.signature(original)})


def apply(session: Any) -> None:
    """Answer ``torch.accelerator`` for the CPU target (no-op on accelerator targets)."""
    mapper = session.device_mapper
    acc = sys.modules.get("torch.accelerator")
    if acc is None or session.target.device_type == "cuda":
        return
    p, log = session.patcher, mapper.log
    owners = [acc, *(m for m in (sys.modules.get("torch.accelerator.memory"),) if m is not None)]
    # On an accelerator target torch.accelerator already names the device and answers for it; only
    # its name is the program's CUDA one (below). Everything else is torch's own there.
    names = ANSWERS if mapper.on_cpu else {"current_accelerator": None}
    for name, cuda_name in names.items():
        original = getattr(acc, name, None)
        if original is None:
            continue  # an older torch without this name
        if name == "device_index":
            value: Any = _device_index_class(original, log)
        else:
            value = _stand_in(name, original, _current_accelerator if cuda_name is None else _via_cuda(cuda_name), log)
        for owner in owners:
            if vars(owner).get(name) is original:
                p.set(owner, name, value)
