"""``torch.compile(mode=...)``: CUDA-graph modes on targets without CUDA graphs.

``mode="reduce-overhead"`` and ``mode="max-autotune"`` turn on CUDA graphs. With the
adapter installed, inductor is told CUDA is available and would try to capture them on
the target, crashing inside CUDA's caching allocator. On a non-CUDA target they become
``"default"`` and ``"max-autotune-no-cudagraphs"`` (the same optimisations without the
capture); each rewrite is logged. ``options={"triton.cudagraphs": True}`` is dropped too.

**A target inductor has no code generator for** (a device whose vendor package registers none, as
the emulated npu): the default backend becomes ``aot_eager`` (graph capture and AOT autograd, the
captured ops run as the device's kernels), logged; a backend the program named is kept
(:func:`_backend_for_target`).

**Dynamo's tables of torch's objects.** torch._dynamo recognises torch's functions and types by
identity, in tables it builds from torch's attributes of the moment: some as it is imported
(its constant-fold and Tensor-attribute tables, its rule map of torch functions), the rest at
their first use (``_torch_private.dynamo_tables``). Built while the adapter's stand-ins are in
place, they would hold the stand-ins: ``torch.cuda.device_count`` would be "a torch op returning
a non-Tensor" (a graph break), ``torch.accelerator.current_accelerator`` a constant whose guard
fails on the frame that made it, every factory a graph break — during the session and after
``uninstall()``. So the tables always hold torch's own objects:

- torch._dynamo imported before ``install()``: :func:`prepare` (before any patch) builds the
  lazily built tables now;
- imported during the session: the import runs with the session's patches suspended (a
  meta-path hook, :mod:`.._after_import`; other threads see torch unpatched for that moment,
  once per process), and the lazily built tables are built in the same moment;
- a table that picked one up anyway (built by a path not foreseen) is forgotten at uninstall,
  to be rebuilt from torch's own; and the first ``torch.compile`` of a session builds any table
  still missing with the patches suspended.

Nothing of the adapter is registered in dynamo: the stand-ins are plain Python that dynamo
inlines (``torch.cuda.is_available`` → ``True``, the factories call torch's with the target's
device, ``torch.accelerator``'s answer the compiled program's: :mod:`.accelerator`), and the
``torch.device`` stand-in is found in dynamo's constant-fold class set, which it hashes and
compares equal in (:mod:`.device_ordinal`). Compiled code guards on the stand-ins' identity, so
code compiled during the session recompiles after ``uninstall()``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..core import torch_private as tp
from ..core.after_import import after_import

__all__ = ["MODES", "prepare", "apply"]

MODES = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def _alone(p: Any) -> Any:
    """The patches suspended for torch._dynamo's first import — only while this is the process's
    one thread. ``Patcher.suspended`` swaps torch's attributes for every thread: with others running
    (a worker thread's first trace() or ``torch._disable_dynamo`` call imports dynamo), they would call
    torch's own factories meanwhile, and a ``device="cuda"`` one fails ("Torch not compiled with CUDA
    enabled"; found by ``run --report`` of a two-thread script under load). Then dynamo's import-time
    tables may hold stand-ins for the session — compiled code can graph-break, never eager code — and
    are forgotten at uninstall as before."""
    import contextlib
    import threading

    return p.suspended() if threading.active_count() == 1 else contextlib.nullcontext()


def prepare(session: Any) -> None:
    """Before any patch: dynamo's tables from torch's own objects, now or as it is imported
    during the session (module docstring)."""
    if session.target.device_type == "cuda":
        return
    p = session.patcher
    after_import(p, "torch._dynamo", lambda _module: tp.build_dynamo_tables(), around=lambda: _alone(p))
    p.before_restore(lambda values: tp.forget_dynamo_tables({id(v) for v in values if callable(v)}))


def _no_global_cudagraphs(kwargs: dict[str, Any], session: Any, log: Any) -> None:
    """``torch._inductor.config.triton.cudagraphs = True`` set by the program (gpt-fast's eval.py
    does at import): inductor would capture CUDA graphs for every compile whose mode keeps the
    global config, and fails on the target (it asks the CUDA caching allocator, which a CPU
    build lacks). Off for this compile, by its ``options`` (mode ``"default"`` is the same as none)."""
    import sys

    config = sys.modules.get("torch._inductor.config")
    if config is None or not getattr(config.triton, "cudagraphs", False) or kwargs.get("mode") not in (None, "default"):
        return
    kwargs.pop("mode", None)
    kwargs["options"] = {**(kwargs.get("options") or {}), "triton.cudagraphs": False}
    log.record("compile", "torch._inductor.config.triton.cudagraphs = True",
               f"cudagraphs off for this torch.compile (no CUDA graphs on {session.target.device_type})", depth=4)


def inductor_generates_for(device_type: str) -> bool:
    """Whether inductor has a code generator for ``device_type``: torch's built-in ones (cpu, cuda,
    xpu, mps, mtia) and any an out-of-tree device registered -- directly, or by its device module's
    ``Scheduling``/``PythonWrapperCodegen``/``CppWrapperCodegen``, which torch's own
    ``init_backend_registration`` reads (torch_npu registers its NPU code generators so)."""
    from torch._inductor.codegen.common import get_scheduling_for_device, init_backend_registration

    init_backend_registration()
    return get_scheduling_for_device(device_type) is not None


def _backend_for_target(kwargs: dict[str, Any], session: Any, log: Any) -> None:
    """``torch.compile``'s default backend (inductor) on a target inductor generates no code for:
    ``aot_eager`` -- the same graph capture and AOT autograd, the captured aten ops run as the target's
    kernels -- instead of failing at the first compiled graph (``KeyError: 'npu'`` in
    ``get_device_op_overrides``; llm.c and gpt-fast ``--compile`` on the emulated npu). Its mode and
    inductor options are inductor's, so they go with it. A backend the program named is kept."""
    device_type = session.target.device_type
    if kwargs.get("backend", "inductor") != "inductor" or device_type == "cpu" or session.target.simulated:
        return
    if inductor_generates_for(device_type):
        return
    dropped = {k: kwargs.pop(k) for k in ("mode", "options") if kwargs.get(k) is not None}
    kwargs["backend"] = "aot_eager"
    extra = f", without its inductor {', '.join(f'{k}={v!r}' for k, v in dropped.items())}" if dropped else ""
    log.record("compile", "torch.compile(backend='inductor')",
               f"backend='aot_eager'{extra} (inductor generates no code for {device_type} here)", depth=4)


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
        _no_global_cudagraphs(kwargs, session, log)
        _backend_for_target(kwargs, session, log)
        return orig(model, *args, **kwargs)

    p.set(torch, "compile", compile)
