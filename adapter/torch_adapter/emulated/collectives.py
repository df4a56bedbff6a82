"""The emulated device's collective backend ``hccl``: torch.distributed on its tensors.

torch_npu registers Ascend's collective library as the c10d backend ``hccl`` for the device type
``npu``; a program written for the NPU calls ``init_process_group("hccl")`` (or no backend at all:
torch picks the accelerator's default, now ``hccl``), then DDP, FSDP2 and ``dist.*`` on ``npu``
tensors. :func:`register` gives the emulated device the same: ``Backend.register_backend("hccl",
creator, devices=[name])``, once per process (:func:`torch_adapter.emulated.start` calls it).

Design:

- **What the backend is.** torch 2.13's Python API cannot subclass the C++ ``Backend`` (it has no
  Python constructor); it can subclass ``ProcessGroup`` (the ``PyProcessGroup`` trampoline, which
  torch's own ``test/distributed/test_c10d_pypg.py`` uses). A creator that returns a ``ProcessGroup``
  subclass *is* the group ``init_process_group``/``new_group`` hand out, and C++ callers (DDP's
  reducer and its ``_broadcast_coalesced``/``_verify_params_across_processes``, the functional
  collectives) reach its Python methods through the trampoline just as Python callers
  (``dist.all_reduce``…, FSDP2) do. The group also answers ``pg._get_backend(device)`` with itself
  (torch asks that object whether it splits, allocates, and its name).
- **Why host copies over gloo.** The device's memory is host memory, but its tensors are of device
  type ``npu``: gloo takes CPU tensors only, and no network library of this machine knows the
  device. So each collective copies its ``npu`` inputs to the host, runs the collective on a
  ``ProcessGroupGloo`` built from the store, rank, size and timeout the creator was given (the real
  wire protocol between the real processes), waits, and copies the results back into the caller's
  ``npu`` tensors in place — the same bytes a device backend would have put there. The copies are
  real device↔host copies (the device's own ``_copy_from``), under the device's guard
  (``torch.npu.device(i)``), as NCCL runs each collective under its device's guard.
- **Semantics: NCCL's, not gloo's**, since this backend stands in for a device backend and programs
  are written for NCCL/HCCL. ``ReduceOp.AVG`` (gloo has none: SUM, then divide; integers truncate
  like NCCL) and ``PREMUL_SUM`` (the factor, a number or a tensor, multiplies a host copy, then SUM);
  bitwise ops are refused as NCCL refuses them; ``bool`` SUM/PRODUCT are logical or/and (NCCL's
  MAX/MIN); complex SUM/AVG reduce the real view. ``all_gather_into_tensor`` /
  ``reduce_scatter_tensor`` take any output/input holding ``world_size ×`` the other's elements, laid
  out rank after rank in memory (NCCL's flat layout, not gloo's dim-0 rule); ``all_gather`` into a
  list of unequal sizes broadcasts from each rank in turn, as NCCL does; ``reduce`` leaves non-root
  tensors untouched; ``recv`` from any source is refused as NCCL refuses it. Reduce-scatters reduce
  the whole input and keep the rank's part (every op and dtype of the all-reduce path; the wire
  carries ``world_size ×`` the data, which an emulation can afford).
- **Work.** A collective is complete when it returns: its ``Work`` wraps a completed
  ``torch.futures.Future`` (devices = the outputs' devices, so the future's events are the device's)
  carrying the output tensors, so ``async_op=True``, ``work.wait()``, ``work.get_future().wait()``
  and DDP's comm-hook futures all work. ``send``/``recv`` are the exception: gloo's point-to-point
  ops are started and their ``Work`` finishes (waits, then copies a received tensor back) on
  ``wait()``/``get_future()``, so ``batch_isend_irecv`` in any order cannot deadlock, as with NCCL.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["BACKEND", "register", "registered"]

BACKEND = "hccl"  # Ascend's collective library: the c10d backend torch_npu registers for "npu"

_LOCK = threading.Lock()
_REGISTERED: set[str] = set()
_GROUP_CLASS: Any = None


def registered() -> frozenset[str]:
    """The device types whose ``hccl`` backend this process registered."""
    return frozenset(_REGISTERED)


def register(name: str) -> None:
    """Register the collective backend ``hccl`` of the emulated ``name`` (once per process)."""
    with _LOCK:
        if name in _REGISTERED:
            return
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_gloo_available():
            return  # a torch without c10d or gloo: no collectives to stand the backend on
        if BACKEND.upper() in dist.Backend._plugins:
            return  # another library's hccl (torch_npu's): left as it is
        dist.Backend.register_backend(BACKEND, _creator(name), devices=[name])
        _REGISTERED.add(name)


def _creator(device_type: str) -> Any:
    def create_hccl(store: Any, rank: int, size: int, timeout: Any) -> Any:
        _host_rng_for_dtensor(device_type)
        return _group_class()(store, rank, size, timeout, device_type)

    create_hccl.__qualname__ = f"create_hccl[{device_type}]"
    return create_hccl


def _host_rng_for_dtensor(device_type: str) -> None:
    """DTensor's random ops on the device draw from its local generator, as on the CPU.

    DTensor's default RNG tracker (``OffsetBasedRNGTracker``, made at the first random op on a mesh
    whose device module has ``set_rng_state``) reads the device's state as a Philox state -- 16 bytes,
    seed then offset -- and moves the offset per shard. That is the state of CUDA's and the real
    NPU's generators; the emulated device's generator is the CPU's Mersenne Twister (its kernels are
    the CPU's, and its losses compare with the CPU target's run for run), whose 5 kB state has no
    offset to move: the tracker fails (``AssertionError`` in ``_PhiloxState.offset``, found by
    pytorch/examples' FSDP2 ``reset_parameters`` after ``to_empty``). So, once a group of the device
    is made, DTensor gets a tracker that runs each random op on the local shard with the local
    generator -- what DTensor does on a CPU mesh -- unless the program (or a library) made one first."""
    try:
        from torch.distributed.tensor import _random as random
    except ImportError:  # a torch without DTensor
        return
    if random._rng_tracker is not None:
        return
    import contextlib

    import torch

    class HostRNGTracker(random._RNGStateTracker):
        """The device's local generator for DTensor's random ops (no offsets: a Mersenne Twister)."""

        @contextlib.contextmanager
        def _distribute_region(self, spec: Any, generator: Any = None) -> Any:
            yield

        def _manual_seed(self, parallel_seed: int) -> None:
            torch.manual_seed(parallel_seed)

    random._rng_tracker = HostRNGTracker(torch.device(device_type))


def _group_class() -> Any:
    """The ``ProcessGroup`` subclass (built on first use: torch.distributed is imported lazily)."""
    global _GROUP_CLASS
    if _GROUP_CLASS is None:
        _GROUP_CLASS = _make_group_class()
    return _GROUP_CLASS


def _make_group_class() -> Any:  # noqa: C901 - one class, its methods are the collectives
    import contextlib

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import (
        AllgatherOptions,
        AllreduceOptions,
        AllToAllOptions,
        BarrierOptions,
        BroadcastOptions,
        GatherOptions,
        ProcessGroupGloo,
        ReduceOptions,
        ScatterOptions,
        _create_work_from_future,
    )

    Op = dist.ReduceOp
    _BITWISE = {Op.BAND, Op.BOR, Op.BXOR}
    _COMPLEX_OK = {Op.SUM, Op.AVG, Op.PREMUL_SUM}

    def _kind(op: Any) -> Any:
        """(RedOpType, premul factor or None) of a ReduceOp, a RedOpType or options carrying one."""
        if op is None:
            return Op.SUM, None
        if hasattr(op, "reduceOp"):
            op = op.reduceOp
        if isinstance(op, Op):
            kind = op.op
            return kind, (op.factor if kind == Op.PREMUL_SUM else None)
        return op, None

    def _host(t: torch.Tensor) -> torch.Tensor:
        """A contiguous host copy of ``t`` (a real device-to-host copy for a device tensor)."""
        return torch.empty(t.shape, dtype=t.dtype).copy_(t.detach())

    def _back(dst: torch.Tensor, host: torch.Tensor) -> None:
        """Copy ``host`` into the caller's tensor in place (its shape, its strides, its device)."""
        dst.detach().copy_(host.reshape(dst.shape))

    def _one(tensors: Any, what: str) -> torch.Tensor:
        if isinstance(tensors, torch.Tensor):
            return tensors
        if len(tensors) != 1:
            raise ValueError(f"{BACKEND} {what}: expecting one tensor only but got {len(tensors)} (NCCL semantics: "
                             "one tensor per process)")
        return tensors[0]

    def _opts(cls: Any, **fields: Any) -> Any:
        """gloo's options object ``cls`` with ``fields`` set."""
        opts = cls()
        for k, v in fields.items():
            setattr(opts, k, v)
        return opts

    class PendingWork(dist._Work):
        """A started gloo point-to-point op, finished (waited, received data copied back) on ``wait``."""

        def __init__(self, group: Any, gloo_works: list, outputs: list, finish: Any) -> None:
            super().__init__()
            self._group, self._gloo_works, self._outputs, self._finish = group, gloo_works, outputs, finish
            self._future: Any = None
            self._lock = threading.Lock()

        def wait(self, timeout: Any = None) -> bool:
            with self._lock:
                if self._future is None:
                    for w in self._gloo_works:
                        w.wait()
                    with torch.no_grad(), self._group._guard(self._outputs):
                        self._finish()
                    self._future = self._group._future(self._outputs)
            return True

        def get_future(self) -> Any:
            self.wait()
            return self._future

        def is_completed(self) -> bool:
            return self._future is not None

        def is_success(self) -> bool:
            return self._future is not None

    class HcclProcessGroup(dist.ProcessGroup):
        """``hccl`` on the emulated device: NCCL's semantics, host copies over a gloo group."""

        supports_splitting = False  # no communicator to split: new_group builds a gloo group of its own
        supports_coalescing = False
        supports_time_estimate = False

        def __init__(self, store: Any, rank: int, size: int, timeout: Any, device_type: str) -> None:
            # (rank, size): torch 2.13's (store, rank, size) constructor builds no Python-subclass instance
            super().__init__(rank, size)
            self._gloo = ProcessGroupGloo(store, rank, size, timeout)
            self._device_type = device_type
            self._coalesced_p2p: list | None = None
            self._group_name = self._group_desc = ""

        # -- identity ------------------------------------------------------------------------
        def getBackendName(self) -> str:  # noqa: N802 - the trampoline's C++ name
            return BACKEND

        # c10d keeps a group's name and description in its backends; this group has none of torch's
        def setGroupName(self, name: str) -> None:  # noqa: N802 - the trampoline's C++ names
            self._group_name = name

        def getGroupName(self) -> str:  # noqa: N802
            return self._group_name

        def setGroupDesc(self, desc: str) -> None:  # noqa: N802
            self._group_desc = desc

        def getGroupDesc(self) -> str:  # noqa: N802
            return self._group_desc

        def _get_backend(self, device: Any = None) -> Any:
            return self  # the object doing this device's collectives: torch asks it about splitting, allocating

        def supports_tensor_alloc(self, device: Any) -> bool:
            return False

        def eager_connect_single_device(self, device: Any) -> None:
            """Nothing to connect eagerly: the gloo group connected when it was built."""

        def _get_sequence_number_for_group(self) -> int:
            return self._gloo._get_sequence_number_for_group()

        def _set_sequence_number_for_group(self) -> None:
            self._gloo._set_sequence_number_for_group()

        def shutdown(self) -> None:
            self._gloo.shutdown()

        def abort(self) -> None:
            self._gloo.abort()

        def __repr__(self) -> str:
            return f"HcclProcessGroup({self._device_type}, rank={self.rank()}, size={self.size()}, over gloo)"

        # -- helpers -------------------------------------------------------------------------
        def _guard(self, tensors: Any) -> Any:
            """The device guard of the first of ``tensors`` on the device (NCCL runs under its device's guard):
            ``torch.npu.device(i)``, the device module's, whichever device is torch's current accelerator."""
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.device.type == self._device_type and t.device.index is not None:
                    return torch.get_device_module(self._device_type).device(t.device.index)
            return contextlib.nullcontext()

        def _future(self, outputs: list) -> Any:
            devices = sorted({t.device for t in outputs if t.device.type != "cpu"}, key=str)
            fut = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
            fut.set_result(outputs)
            return fut

        def _done(self, outputs: list) -> Any:
            return _create_work_from_future(self._future(outputs))

        def _reduce(self, buf: torch.Tensor, op: Any, root: int | None = None) -> None:
            """Reduce the host tensor ``buf`` in place over the group with NCCL's op semantics
            (``root`` given: only the root's ``buf`` holds the result)."""
            kind, factor = _kind(op)
            if kind in _BITWISE:
                raise ValueError(f"Cannot use {kind} with {BACKEND} (as with NCCL: bitwise reductions are gloo's and "
                                 "MPI's)")
            if buf.is_complex() and kind not in _COMPLEX_OK:
                raise ValueError(f"{BACKEND}: {kind} is not supported on complex tensors (NCCL semantics)")
            work = buf
            if buf.dtype == torch.bool:
                if kind in (Op.AVG, Op.PREMUL_SUM):
                    raise ValueError(f"Cannot use {kind} with boolean inputs")
                work = buf.to(torch.uint8)
                kind = {Op.SUM: Op.MAX, Op.PRODUCT: Op.MIN}.get(kind, kind)  # NCCL: logical or / and
            elif buf.is_complex():
                work = torch.view_as_real(buf)
            if kind == Op.PREMUL_SUM:
                work.mul_(factor.detach().to("cpu") if isinstance(factor, torch.Tensor) else factor)
            gloo_op = Op.SUM if kind in (Op.AVG, Op.PREMUL_SUM) else kind
            if root is None:
                self._gloo.allreduce([work], _opts(AllreduceOptions, reduceOp=gloo_op)).wait()
            else:
                self._gloo.reduce([work], _opts(ReduceOptions, reduceOp=gloo_op, rootRank=root,
                                                rootTensor=0)).wait()
            if kind == Op.AVG:
                if work.is_floating_point():
                    work.div_(self.size())
                else:
                    work.div_(self.size(), rounding_mode="trunc")
            if work is not buf and buf.dtype == torch.bool:
                buf.copy_(work)

        # -- reductions ----------------------------------------------------------------------
        def allreduce(self, tensors: Any, opts: Any = None) -> Any:
            t = _one(tensors, "allreduce")
            with torch.no_grad(), self._guard([t]):
                host = _host(t)
                self._reduce(host, opts)
                _back(t, host)
            return self._done([t])

        def allreduce_coalesced(self, tensors: list, opts: Any = None) -> Any:
            with torch.no_grad(), self._guard(tensors):
                for t in tensors:
                    host = _host(t)
                    self._reduce(host, opts)
                    _back(t, host)
            return self._done(list(tensors))

        def reduce(self, tensors: Any, opts: Any = None) -> Any:
            t = _one(tensors, "reduce")
            root = opts.rootRank if opts is not None else 0
            with torch.no_grad(), self._guard([t]):
                host = _host(t)
                self._reduce(host, opts, root=root)
                if self.rank() == root:  # NCCL: the other ranks' tensors are left as they were
                    _back(t, host)
            return self._done([t])

        def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
            out = _one(output_tensors, "reduce_scatter")
            inputs = input_tensors[0] if isinstance(input_tensors[0], (list, tuple)) else input_tensors
            if len(inputs) != self.size():
                raise ValueError(f"{BACKEND} reduce_scatter: expected {self.size()} input tensors (one per rank), "
                                 f"got {len(inputs)}")
            with torch.no_grad(), self._guard([out, *inputs]):
                flat = torch.cat([_host(x).reshape(-1) for x in inputs])
                self._reduce(flat, opts)
                start = sum(x.numel() for x in inputs[: self.rank()])
                _back(out, flat[start:start + out.numel()])
            return self._done([out])

        def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                                  opts: Any = None) -> Any:
            if input.numel() != output.numel() * self.size():
                raise ValueError(f"{BACKEND} reduce_scatter_tensor: the input tensor must hold world_size "
                                 f"({self.size()}) times the output's elements: input {tuple(input.shape)}, "
                                 f"output {tuple(output.shape)}")
            if input.dtype != output.dtype:
                raise TypeError(f"{BACKEND} reduce_scatter_tensor: input ({input.dtype}) and output ({output.dtype}) "
                                "must have the same dtype")
            n = output.numel()
            with torch.no_grad(), self._guard([output, input]):
                flat = _host(input).reshape(-1)  # NCCL's flat layout: rank r's part is elements [r*n, (r+1)*n)
                self._reduce(flat, opts)
                _back(output, flat[self.rank() * n:(self.rank() + 1) * n])
            return self._done([output])

        _reduce_scatter_base = reduce_scatter_single

        def reduce_scatter_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:
            for o, i in zip(outputs, inputs):
                self.reduce_scatter_single(o, i, opts)
            return self._done(list(outputs))

        reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

        # -- data movement -------------------------------------------------------------------
        def broadcast(self, tensors: Any, opts: Any = None) -> Any:
            t = _one(tensors, "broadcast")
            root = opts if isinstance(opts, int) else (opts.rootRank if opts is not None else 0)
            with torch.no_grad(), self._guard([t]):
                host = _host(t)
                self._gloo.broadcast([host], _opts(BroadcastOptions, rootRank=root, rootTensor=0)).wait()
                if self.rank() != root:
                    _back(t, host)
            return self._done([t])

        def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
            inp = _one(input_tensors, "allgather")
            outs = output_tensors[0] if isinstance(output_tensors[0], (list, tuple)) else output_tensors
            if len(outs) != self.size():
                raise ValueError(f"{BACKEND} all_gather: expected {self.size()} output tensors (one per rank), "
                                 f"got {len(outs)}")
            if any(o.dtype != inp.dtype for o in outs):
                raise TypeError(f"{BACKEND} all_gather: the output tensors must have the input's dtype ({inp.dtype})")
            with torch.no_grad(), self._guard([inp, *outs]):
                host_in = _host(inp)
                if all(o.shape == inp.shape for o in outs):
                    host_outs = [torch.empty_like(host_in) for _ in outs]
                    self._gloo.allgather([host_outs], [host_in], AllgatherOptions()).wait()
                else:  # NCCL's uneven all_gather: a broadcast from each rank in turn
                    host_outs = []
                    for r, o in enumerate(outs):
                        buf = host_in if r == self.rank() else torch.empty(o.shape, dtype=o.dtype)
                        self._gloo.broadcast([buf], _opts(BroadcastOptions, rootRank=r, rootTensor=0)).wait()
                        host_outs.append(buf)
                for o, h in zip(outs, host_outs):
                    _back(o, h)
            return self._done(list(outs))

        def allgather_coalesced(self, output_lists: list, input_list: list, opts: Any = None) -> Any:
            for outs, inp in zip(output_lists, input_list):
                self.allgather([outs], [inp], opts)
            return self._done([o for outs in output_lists for o in outs])

        def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
            if output.numel() != input.numel() * self.size():
                raise ValueError(f"{BACKEND} all_gather_into_tensor: the output tensor must hold world_size "
                                 f"({self.size()}) times the input's elements: output {tuple(output.shape)}, "
                                 f"input {tuple(input.shape)}")
            if input.dtype != output.dtype:
                raise TypeError(f"{BACKEND} all_gather_into_tensor: input ({input.dtype}) and output ({output.dtype}) "
                                "must have the same dtype")
            with torch.no_grad(), self._guard([output, input]):
                host_in = _host(input)
                host_out = torch.empty((self.size(), *input.shape), dtype=input.dtype)  # rank after rank
                self._gloo.allgather([list(host_out.unbind(0))], [host_in], AllgatherOptions()).wait()
                _back(output, host_out)
            return self._done([output])

        _allgather_base = all_gather_single

        def all_gather_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:
            for o, i in zip(outputs, inputs):
                self.all_gather_single(o, i, opts)
            return self._done(list(outputs))

        allgather_into_tensor_coalesced = all_gather_single_coalesced

        def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
            inp = _one(input_tensors, "gather")
            root = opts.rootRank if opts is not None else 0
            gopts = _opts(GatherOptions, rootRank=root)
            with torch.no_grad(), self._guard([inp]):
                host_in = _host(inp)
                if self.rank() == root:
                    outs = output_tensors[0]
                    if len(outs) != self.size():
                        raise ValueError(f"{BACKEND} gather: expected {self.size()} output tensors on the root, "
                                         f"got {len(outs)}")
                    host_outs = [torch.empty(o.shape, dtype=o.dtype) for o in outs]
                    self._gloo.gather([host_outs], [host_in], gopts).wait()
                    for o, h in zip(outs, host_outs):
                        _back(o, h)
                    return self._done(list(outs))
                self._gloo.gather([], [host_in], gopts).wait()
            return self._done([])

        def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
            out = _one(output_tensors, "scatter")
            root = opts.rootRank if opts is not None else 0
            with torch.no_grad(), self._guard([out]):
                host_out = torch.empty(out.shape, dtype=out.dtype)
                host_ins = [[_host(x) for x in input_tensors[0]]] if self.rank() == root else []
                self._gloo.scatter([host_out], host_ins, _opts(ScatterOptions, rootRank=root)).wait()
                _back(out, host_out)
            return self._done([out])

        def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list,  # noqa: A002
                              input_split_sizes: list, opts: Any = None) -> Any:
            with torch.no_grad(), self._guard([output, input]):
                host_in = _host(input)
                host_out = torch.empty(output.shape, dtype=output.dtype)
                self._gloo.alltoall_base(host_out, host_in, list(output_split_sizes), list(input_split_sizes),
                                         AllToAllOptions()).wait()
                _back(output, host_out)
            return self._done([output])

        alltoall_base = all_to_all_single

        def alltoall(self, output_tensors: list, input_tensors: list, opts: Any = None) -> Any:
            if len(output_tensors) != self.size() or len(input_tensors) != self.size():
                raise ValueError(f"{BACKEND} all_to_all: expected {self.size()} input and output tensors, got "
                                 f"{len(input_tensors)} and {len(output_tensors)}")
            dtypes = {t.dtype for t in (*output_tensors, *input_tensors)}
            if len(dtypes) != 1:
                raise TypeError(f"{BACKEND} all_to_all: all tensors must have one dtype, "
                                f"got {sorted(map(str, dtypes))}")
            with torch.no_grad(), self._guard([*output_tensors, *input_tensors]):
                flat_in = torch.cat([_host(t).reshape(-1) for t in input_tensors])
                out_sizes = [t.numel() for t in output_tensors]
                flat_out = torch.empty(sum(out_sizes), dtype=flat_in.dtype)
                self._gloo.alltoall_base(flat_out, flat_in, out_sizes, [t.numel() for t in input_tensors],
                                         AllToAllOptions()).wait()
                for o, piece in zip(output_tensors, flat_out.split(out_sizes)):
                    _back(o, piece)
            return self._done(list(output_tensors))

        def barrier(self, opts: Any = None) -> Any:
            self._gloo.barrier(BarrierOptions()).wait()
            return self._done([])

        # -- point to point ------------------------------------------------------------------
        def _pending(self, gloo_works: list, outputs: list, finish: Any) -> Any:
            work = PendingWork(self, gloo_works, outputs, finish)
            if self._coalesced_p2p is not None:
                self._coalesced_p2p.append(work)
            return work

        def send(self, tensors: Any, dst: int, tag: int = 0) -> Any:
            t = _one(tensors, "send")
            with torch.no_grad(), self._guard([t]):
                host = _host(t)
            return self._pending([self._gloo.send([host], dst, tag)], [], lambda: None)

        def recv(self, tensors: Any, src: int, tag: int = 0) -> Any:
            t = _one(tensors, "recv")
            host = torch.empty(t.shape, dtype=t.dtype)
            return self._pending([self._gloo.recv([host], src, tag)], [t], lambda: _back(t, host))

        def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
            raise ValueError(f"{BACKEND}: recv from any source is not supported (as with NCCL): pass src")

        # -- coalescing (torch's _coalescing_manager(device=...)) ------------------------------
        def start_coalescing(self, device: Any) -> None:
            self._coalesced_p2p = []

        def end_coalescing(self, device: Any) -> Any:
            works, self._coalesced_p2p = self._coalesced_p2p or [], None
            return PendingWork(self, works, [], lambda: None)

    HcclProcessGroup.__module__ = __name__
    PendingWork.__module__ = __name__
    return HcclProcessGroup
