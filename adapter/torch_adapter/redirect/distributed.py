"""torch.distributed: "nccl" → the target's collective backend; DDP device ids.

``init_process_group("nccl")``, ``backend="cuda:nccl,cpu:gloo"``, ``new_group(backend=
"nccl")`` and ``init_device_mesh("cuda", ...)`` use the target's backend (gloo on the
CPU and MPS, hccl on NPU, xccl on XPU, nccl on CUDA; ``configure(
communication_backend=...)`` overrides). ``DistributedDataParallel(device_ids=[i])`` gets
the target's device ids (none on the CPU, where DDP requires ``None``). It rides on
torch.distributed as it is: no launcher, no collective of our own.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..core.patching import bindings
from .nccl_semantics import patch_gather_into_tensor, patch_reductions

__all__ = ["map_backend", "apply"]

_HALF = torch.float16


def map_backend(backend: Any, target_type: str, collective: str) -> Any:
    """The backend string the target uses for ``backend`` (unchanged if not CUDA's)."""
    if backend is None or not isinstance(backend, str):
        return backend
    text = str(backend).lower()
    if ":" not in text:
        return collective if text == "nccl" else backend
    # "cuda:nccl,cpu:gloo" -> per-device pairs; CUDA's pair moves to the target's device
    pairs: dict[str, str] = {}
    for part in text.split(","):
        dev, _, be = part.partition(":")
        be = collective if be == "nccl" else be
        dev = target_type if dev == "cuda" else dev
        pairs.setdefault(dev, be)
    return ",".join(f"{d}:{b}" for d, b in pairs.items())


def apply(session: Any) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    target = session.target
    if target.device_type == "cuda" and not session.config.communication_backend:
        return

    groups = _patch_groups(session, c10d)
    _patch_device_mesh(session)
    _patch_ddp(session)
    _patch_fsdp1(session)
    patch_gather_into_tensor(session, groups)
    patch_reductions(session, groups)
    _keep_destroyed_gloo_groups(session, groups.chosen)


class _Groups:
    """Which process groups run gloo because the program asked for nccl.

    ``chosen``: the groups the adapter made gloo in nccl's place (``init_process_group("nccl")``,
    ``new_group(backend="nccl")``); ``asked_gloo``: the groups the program asked gloo for itself. A group
    made with no backend (a DeviceMesh's, FSDP2's) inherits the default group's, so it is the adapter's
    when the default group is (:meth:`ours`)."""

    def __init__(self) -> None:
        self.chosen: set[int] = set()
        self.asked_gloo: set[int] = set()
        from torch.distributed import distributed_c10d

        import inspect

        self.real_backend = inspect.unwrap(distributed_c10d.get_backend)  # never the stand-in (mapped back)

    def ours(self, group: Any) -> bool:
        """Does ``group`` (None: the default group) run gloo in place of the program's nccl?"""
        import torch.distributed as dist

        pg = group if group is not None else dist.group.WORLD
        if pg is None:
            return False
        if id(pg) in self.chosen:
            return True
        world = dist.group.WORLD
        if world is None or id(world) not in self.chosen or id(pg) in self.asked_gloo:
            return False
        try:
            return self.real_backend(pg) == "gloo"
        except (RuntimeError, ValueError):  # not a group of this process
            return False


# A program's last collective, then its exit: torch 2.13's gloo aborted a rank at interpreter exit
# ("terminate called without an active exception", SIGABRT) in 3 of 8 torchrun runs of a plain DDP
# script, no adapter involved. gdb: gloo's worker thread (``pt_gloo_runloop``) drops its finished work
# (``~AsyncAllgatherWork`` → ``TensorImpl::decref_pyobject``), which takes the GIL; the interpreter is
# finalizing by then, so ``take_gil`` ends the thread (``pthread_exit``) and the forced unwind through
# a noexcept frame calls ``std::terminate``. Letting go of the GIL for a moment at exit lets the worker
# drop its work first: 0 of 12 runs aborted with it. So a process that made a group under the adapter
# waits that moment at exit (an ``atexit`` handler, removed at ``uninstall()``).
GLOO_EXIT_SETTLE_S = 0.2


def _settle_collective_threads() -> None:
    import time

    time.sleep(GLOO_EXIT_SETTLE_S)  # the GIL released: the backend's worker threads finish with their work


def _settle_at_exit(session: Any) -> None:
    """Register :func:`_settle_collective_threads` for the session (see above); ``uninstall()`` removes it."""
    import atexit

    atexit.register(_settle_collective_threads)
    session.closers.append(lambda: atexit.unregister(_settle_collective_threads))


def _patch_groups(session: Any, c10d: Any) -> _Groups:
    """``init_process_group`` / ``new_group`` / ``barrier``: NCCL becomes the target's backend, CUDA
    device ids the target's. Returns which groups the adapter made gloo in NCCL's place (:class:`_Groups`)."""
    import torch.distributed as dist

    target = session.target
    p, log, mapper = session.patcher, session.redirect_log, session.device_mapper
    def collective() -> str:
        return session.config.communication_backend or target.dist_backend

    def mapped(backend: Any, what: str) -> Any:
        new = map_backend(backend, target.device_type, collective())
        if new != backend:
            log.record("distributed", f"{what}(backend={backend!r})", repr(new), depth=4)
        return new

    orig_init = c10d.init_process_group

    groups = _Groups()
    settling = [False]  # the exit handler, once per session
    chosen = groups.chosen  # the groups the adapter made gloo in place of nccl (see _keep_destroyed_gloo_groups)

    @functools.wraps(orig_init)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            backend = kwargs.pop("backend")
        asked, backend = backend, mapped(backend, "init_process_group")
        dev = kwargs.get("device_id")
        if dev is not None:
            new = mapper.map(dev, "init_process_group(device_id)", ints=True)
            kwargs["device_id"] = None if mapper.on_cpu else new
        out = orig_init(backend, *args, **kwargs)
        if not settling[0]:
            settling[0] = True
            _settle_at_exit(session)
        if _made_gloo(asked, backend):
            chosen.add(id(dist.group.WORLD))
        return out

    orig_new_group = c10d.new_group

    @functools.wraps(orig_new_group)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        asked = args[2] if len(args) >= 3 else kwargs.get("backend")
        if len(args) >= 3:
            args = (*args[:2], mapped(args[2], "new_group"), *args[3:])
        if "backend" in kwargs:
            kwargs["backend"] = mapped(kwargs["backend"], "new_group")
        if kwargs.get("device_id") is not None:
            kwargs["device_id"] = None if mapper.on_cpu else mapper.map(kwargs["device_id"], "new_group(device_id)")
        group = orig_new_group(*args, **kwargs)
        if _made_gloo(asked, args[2] if len(args) >= 3 else kwargs.get("backend")):
            chosen.add(id(group))
        elif isinstance(asked, str) and "gloo" in asked.lower():
            groups.asked_gloo.add(id(group))
        return group

    orig_barrier = c10d.barrier

    @functools.wraps(orig_barrier)
    def barrier(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device_ids") is not None and collective() != "nccl":
            log.record("distributed", "barrier(device_ids=...)", "barrier() (device_ids is NCCL-only)", depth=3)
            kwargs["device_ids"] = None
        return orig_barrier(*args, **kwargs)

    # distributed_c10d defines them; torch.distributed, device_mesh, ... bind them by import.
    for name, new, orig in (("init_process_group", init_process_group, orig_init),
                            ("new_group", new_group, orig_new_group), ("barrier", barrier, orig_barrier)):
        for owner, _, _ in bindings(orig, within="torch.distributed", name=name):
            p.set(owner, name, new)
    return groups


def _patch_device_mesh(session: Any) -> None:
    """``init_device_mesh("cuda", ...)`` builds the mesh on the target's device type."""
    target, p, log = session.target, session.patcher, session.redirect_log
    try:
        from torch.distributed import device_mesh as dm
    except ImportError:  # pragma: no cover - old torch
        return
    orig_mesh = dm.init_device_mesh

    @functools.wraps(orig_mesh)
    def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        if isinstance(device_type, str) and device_type.startswith("cuda"):
            log.record("distributed", f"init_device_mesh({device_type!r})", repr(target.device_type), depth=3)
            device_type = target.device_type
        return orig_mesh(device_type, *args, **kwargs)

    for owner, _, _ in bindings(orig_mesh, within="torch.distributed", name="init_device_mesh"):
        p.set(owner, "init_device_mesh", init_device_mesh)


_FSDP1 = "torch.distributed.fsdp.fully_sharded_data_parallel"


def _patch_fsdp1(session: Any) -> None:
    """``FullyShardedDataParallel`` (FSDP1) on the target's device, once its module is imported.

    - ``device_id`` (``torch.cuda.current_device()``, ``cuda:i``) names the target's device. Before, an int
      became ``torch.device(0)`` = cuda:0 (the adapter's ordinal rule) while the parameters sat on the CPU:
      "An FSDP-managed module unexpectedly has parameters on cpu. Make sure to move the module to cuda:0".
      Without ``device_id`` a module the program moved "to cuda" is on the CPU target's CPU, where FSDP
      looked for an accelerator and found none; it gets the target's device.
    - Unsharding with ``offload_to_cpu=True`` (``FullStateDictConfig(offload_to_cpu=True,
      rank0_only=True)``, the usual way to save a full checkpoint; ``summon_full_params(offload_to_cpu=
      True)``) where the compute device already is the CPU unshards in place: torch's offload path on a
      CPU compute device freed the parameters' storage ("setStorage: ... out of bounds for storage of
      size 0"), and there is nothing to offload to.
    - ``sync_module_states=True`` (accelerate's FSDP plugin sets it) on the CPU target: FSDP refused "CPU
      parameters or buffers when `sync_module_states=True`, which requires them to be on GPU" — nccl
      broadcasts only device tensors; there the module's device is the CPU and gloo broadcasts them.
    """
    from ..core.after_import import after_import

    after_import(session.patcher, _FSDP1, lambda module: _adapt_fsdp1(session, module))


def _adapt_fsdp1(session: Any, module: Any) -> None:
    import inspect

    p, mapper = session.patcher, session.device_mapper
    fsdp = getattr(module, "FullyShardedDataParallel", None)
    if fsdp is None:  # pragma: no cover - another torch
        return
    orig_init = fsdp.__init__
    sig = inspect.signature(orig_init)

    @functools.wraps(orig_init)
    def fsdp_init(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = sig.bind(self, *args, **kwargs)
        dev = bound.arguments.get("device_id")
        if dev is not None:
            bound.arguments["device_id"] = mapper.map(dev, f"FSDP(device_id={dev!r})", ints=True)
        elif mapper.on_cpu and bound.arguments.get("device_mesh") is None:
            bound.arguments["device_id"] = mapper.device(None)
        mp = bound.arguments.get("mixed_precision")
        if mp is not None and mapper.half_as is not None:
            bound.arguments["mixed_precision"] = _mixed_precision_mapped(mp, mapper)
        orig_init(*bound.args, **bound.kwargs)

    p.set(fsdp, "__init__", fsdp_init)
    try:
        from torch.distributed.fsdp import _unshard_param_utils as unshard
    except ImportError:  # pragma: no cover - another torch
        return
    orig_unshard = getattr(unshard, "_unshard_fsdp_state_params", None)
    if orig_unshard is None:  # pragma: no cover
        return

    @functools.wraps(orig_unshard)
    def unshard_state_params(module: Any, state: Any, writeback: bool, rank0_only: bool, offload_to_cpu: bool,
                             with_grads: bool) -> Any:
        device = getattr(state, "compute_device", None)
        if offload_to_cpu and device is not None and device.type == "cpu":
            offload_to_cpu = False  # already on the CPU: unshard in place
        return orig_unshard(module, state, writeback, rank0_only, offload_to_cpu, with_grads)

    for owner, name, _ in bindings(orig_unshard, within="torch.distributed", name="_unshard_fsdp_state_params"):
        p.set(owner, name, unshard_state_params)
    if not mapper.on_cpu:
        return
    from torch.distributed.fsdp import _init_utils

    orig_check = getattr(_init_utils, "_check_module_states_for_sync_module_states", None)
    if orig_check is None:  # pragma: no cover
        return

    @functools.wraps(orig_check)
    def check_module_states(module_states: list[Any]) -> None:
        return None  # on the CPU target the module's states live on its device, the CPU; gloo broadcasts them

    p.set(_init_utils, "_check_module_states_for_sync_module_states", check_module_states)


def _mixed_precision_mapped(mp: Any, mapper: Any) -> Any:
    """FSDP's ``MixedPrecision`` with its float16 dtypes under the dtype policy (``mapper.dtype``).

    Where float16 requests give float32 tensors (dtype_policy ``auto`` on a CPU that computes float16 in
    float32), FSDP's ``_cast_forward_inputs`` (``x.to(torch.float16)``) gave float32 inputs and
    ``autocast("cuda", float16)`` runs disabled, while FSDP's unsharded parameters — made by factories on
    the CPU compute device with ``dtype=param_dtype``, which the policy does not see — stayed float16: a
    conv/linear of a float32 input by float16 weights ("Input type (float) and bias type (c10::Half)
    should be the same"). Mapped here, the parameters, gradients' reduction and buffers follow the
    inputs' float32, as every other float16 request of the program does."""
    import dataclasses

    if not dataclasses.is_dataclass(mp):
        return mp
    changes = {f.name: mapper.dtype(getattr(mp, f.name), f"FSDP(mixed_precision.{f.name}=torch.float16)")
               for f in dataclasses.fields(mp) if getattr(mp, f.name, None) is _HALF}
    return dataclasses.replace(mp, **changes) if changes else mp


def _made_gloo(asked: Any, became: Any) -> bool:
    """Did the adapter turn a backend the program asked for into gloo?"""
    return asked != became and isinstance(became, str) and "gloo" in became


def _keep_destroyed_gloo_groups(session: Any, chosen: set[int]) -> None:
    """A gloo group the adapter chose for "nccl" is never freed after ``destroy_process_group``.

    Measured (torch 2.13, timm's train.py, torchrun 2 ranks): ``main()`` calls
    ``destroy_process_group()`` and returns; DDP's Reducer, freed with ``main``'s locals, drops the
    last reference to the shut-down ProcessGroupGloo, whose destructor then blocks on a mutex
    forever (rank 0 in a futex wait, its DataLoader workers alive). NCCL, which the script was
    written for, does not. Keeping one reference to each destroyed gloo group (its threads are
    already stopped by ``shutdown()``) means that destructor never runs; the OS reclaims it at exit.
    Only the groups the adapter made gloo in place of the program's nccl (``chosen``: their ids,
    noted at ``init_process_group``/``new_group``) are kept; a gloo group the program asked for
    itself is freed as in plain torch.
    """
    import ctypes

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    orig = c10d.destroy_process_group
    log = session.redirect_log

    @functools.wraps(orig)
    def destroy_process_group(group: Any = None) -> None:
        doomed = group if group is not None else dist.group.WORLD
        ours = doomed is not None and id(doomed) in chosen
        orig(group)
        if ours:
            chosen.discard(id(doomed))
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(doomed))
            log.record("distributed", "destroy_process_group()", "gloo group shut down, kept until exit", depth=3)

    for owner, name, _ in bindings(orig, within="torch.distributed"):
        session.patcher.set(owner, name, destroy_process_group)


def _patch_ddp(session: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    p, log, mapper = session.patcher, session.redirect_log, session.device_mapper
    orig_init = DDP.__init__

    def map_id(d: Any) -> Any:
        new = mapper.map(d, "DDP(device_ids)", ints=True)
        return new.index if isinstance(new, type(torch.device("cpu"))) and new.index is not None else new

    @functools.wraps(orig_init)
    def ddp_init(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, *args: Any,
                 **kwargs: Any) -> None:
        if device_ids is not None or output_device is not None:
            if mapper.on_cpu:
                log.record("distributed", f"DDP(device_ids={device_ids!r})", "device_ids=None (CPU module)", depth=3)
                device_ids = output_device = None
            else:
                device_ids = [map_id(d) for d in device_ids] if device_ids is not None else None
                output_device = map_id(output_device) if output_device is not None else None
        orig_init(self, module, device_ids, output_device, *args, **kwargs)

    p.set(DDP, "__init__", ddp_init)
