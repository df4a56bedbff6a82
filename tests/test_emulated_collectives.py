"""The emulated npu's collective backend ``hccl`` (torch_adapter/emulated/collectives.py), on two real ranks.

Two processes (this file run as a script, one per rank, a free port each time) start the emulated device
with two devices, take ``npu:<rank>``, ``init_process_group("hccl")`` and run every collective on npu tensors,
synchronously and with ``async_op=True`` (``work.wait()`` and ``work.get_future().wait()``), against the values
NCCL gives: all_reduce with every reduce op (AVG and PREMUL_SUM that gloo lacks, integer AVG truncated, bool
SUM as logical or, bitwise ops refused), broadcast, all_gather (equal and unequal sizes), all_gather_into_tensor
and reduce_scatter_tensor in NCCL's flat layout (and coalesced), reduce_scatter, all_to_all(_single), barrier,
send/recv and batch_isend_irecv (receives posted first), gather, scatter, reduce (non-root untouched), object
collectives, a functional collective (a C++ caller), a subgroup; DDP over the two ranks (3 steps: replicas
identical, gradients equal to a single-process reference) and FSDP2 (``fully_shard``: losses and parameters
equal to a single-process reference); last, a group made with no backend and ``device_id`` (an NPU program's
``init_process_group(device_id=...)``), which must pick ``hccl``.

Each rank writes what each check found (JSON); one test per check reads both ranks' answers.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest

WORLD = 2
CHECKS: dict[str, Callable[..., None]] = {}


def _check(name: str, *, modes: bool = True) -> Callable:
    """Register a check run on both ranks; ``modes``: once synchronous and once with ``async_op=True``."""

    def deco(fn: Callable) -> Callable:
        if modes:
            CHECKS[name] = functools.partial(fn, async_op=False)
            CHECKS[f"{name}[async]"] = functools.partial(fn, async_op=True)
        else:
            CHECKS[name] = fn
        return fn

    return deco


# ------------------------------------------------------------------------------------------------
# The checks (run in the ranks; torch is imported there)

class Ctx:
    def __init__(self, rank: int) -> None:
        import torch

        self.rank = rank
        self.dev = torch.device("npu", rank)


def _done(work: Any, async_op: bool, *outputs: Any) -> None:
    """A sync call returns no work; an async one a completed work whose future carries the outputs."""
    if not async_op:
        assert work is None, f"a synchronous call returned {work!r}"
        return
    assert work is not None, "async_op=True returned no work"
    assert work.wait() is True, "work.wait() did not return True"
    value = work.get_future().wait()
    assert isinstance(value, list), f"the future's value is {type(value).__name__}, not a list of tensors"
    ptrs = {v.data_ptr() for v in value}
    for out in outputs:
        assert out.data_ptr() in ptrs, "the future's value does not carry the output tensor"


def _eq(got: Any, expect: Any, what: str) -> None:
    import torch

    assert got.device.type == "npu", f"{what}: the result left the device ({got.device})"
    got = got.cpu()
    expect = torch.as_tensor(expect).to(got.dtype).expand_as(got) if not isinstance(expect, torch.Tensor) else expect
    assert torch.equal(got, expect.to(got.dtype)), f"{what}: got {got.tolist()}, expected {expect.tolist()}"


@_check("all_reduce")
def _all_reduce(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    Op = dist.ReduceOp
    cases = [(Op.SUM, 3.0), (Op.AVG, 1.5), (Op.PRODUCT, 2.0), (Op.MIN, 1.0), (Op.MAX, 2.0),
             (Op.PREMUL_SUM(0.5), 1.5), (dist._make_nccl_premul_sum(torch.tensor(2.0, device=c.dev)), 6.0)]
    for op, expect in cases:
        t = torch.full((2, 3), float(c.rank + 1), device=c.dev)
        work = dist.all_reduce(t, op=op, async_op=async_op)
        _done(work, async_op, t)
        _eq(t, torch.full((2, 3), expect), f"all_reduce {op}")
    t = torch.tensor([1 + 3 * c.rank, -1 - 3 * c.rank], device=c.dev)  # 1, 4 / -1, -4: AVG 2.5, -2.5
    _done(dist.all_reduce(t, op=Op.AVG, async_op=async_op), async_op, t)
    _eq(t, torch.tensor([2, -2]), "all_reduce AVG int64 (truncated, as NCCL)")
    b = torch.tensor([c.rank == 0, False, True], device=c.dev)
    _done(dist.all_reduce(b, async_op=async_op), async_op, b)
    _eq(b, torch.tensor([True, False, True]), "all_reduce SUM bool (logical or, as NCCL)")
    z = torch.full((3,), complex(c.rank + 1, 2 * c.rank), device=c.dev)
    _done(dist.all_reduce(z, op=Op.AVG, async_op=async_op), async_op, z)
    _eq(z, torch.full((3,), complex(1.5, 1.0)), "all_reduce AVG complex64")
    h = torch.full((4,), 0.5 * (c.rank + 1), device=c.dev, dtype=torch.bfloat16)
    _done(dist.all_reduce(h, async_op=async_op), async_op, h)
    _eq(h, torch.full((4,), 1.5, dtype=torch.bfloat16), "all_reduce SUM bfloat16")


@_check("all_reduce bitwise refused", modes=False)
def _bitwise(c: Ctx) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(2, dtype=torch.int32, device=c.dev)
    with pytest.raises(ValueError, match="BAND"):
        dist.all_reduce(t, op=dist.ReduceOp.BAND)


@_check("broadcast")
def _broadcast(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    for src in range(WORLD):
        t = torch.arange(6.0, device=c.dev).view(2, 3) + 10 * c.rank
        _done(dist.broadcast(t, src=src, async_op=async_op), async_op, t)
        _eq(t, torch.arange(6.0).view(2, 3) + 10 * src, f"broadcast from {src}")


@_check("all_gather")
def _all_gather(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    outs = [torch.empty(2, 3, device=c.dev) for _ in range(WORLD)]
    _done(dist.all_gather(outs, torch.full((2, 3), float(c.rank), device=c.dev), async_op=async_op), async_op, *outs)
    for r, o in enumerate(outs):
        _eq(o, torch.full((2, 3), float(r)), f"all_gather part {r}")
    # unequal sizes (NCCL broadcasts from each rank in turn)
    outs = [torch.empty(r + 1, 2, device=c.dev) for r in range(WORLD)]
    inp = torch.full((c.rank + 1, 2), float(c.rank + 7), device=c.dev)
    _done(dist.all_gather(outs, inp, async_op=async_op), async_op, *outs)
    for r, o in enumerate(outs):
        _eq(o, torch.full((r + 1, 2), float(r + 7)), f"all_gather of unequal sizes, part {r}")


@_check("all_gather_into_tensor")
def _all_gather_into_tensor(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    expect = torch.cat([torch.arange(6.0) + 10 * r for r in range(WORLD)])  # rank after rank, flat
    for shape, fn in (((WORLD * 6,), dist.all_gather_into_tensor), ((WORLD * 2, 3), dist.all_gather_into_tensor),
                      ((WORLD, 2, 3), dist.all_gather_single), ((3, WORLD * 2), dist.all_gather_single)):
        x = (torch.arange(6.0, device=c.dev) + 10 * c.rank).view(2, 3)
        out = torch.empty(shape, device=c.dev)
        _done(fn(out, x, async_op=async_op), async_op, out)
        _eq(out.reshape(-1), expect, f"{fn.__name__} into {shape}")
    leaf = (torch.arange(6.0, device=c.dev) + 10 * c.rank).requires_grad_()  # live logits: NCCL takes them
    out = torch.empty(WORLD * 6, device=c.dev)
    _done(dist.all_gather_into_tensor(out, leaf, async_op=async_op), async_op, out)
    _eq(out, expect, "all_gather_into_tensor of an input that requires grad")
    with pytest.raises(ValueError, match="world_size"):
        dist.all_gather_into_tensor(torch.empty(5, device=c.dev), torch.ones(3, device=c.dev))


@_check("reduce_scatter")
def _reduce_scatter(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    out = torch.empty(3, device=c.dev)
    inputs = [torch.full((3,), float(c.rank + 1 + r), device=c.dev) for r in range(WORLD)]
    _done(dist.reduce_scatter(out, inputs, async_op=async_op), async_op, out)
    _eq(out, torch.full((3,), float(sum(k + 1 + c.rank for k in range(WORLD)))), "reduce_scatter SUM")
    _done(dist.reduce_scatter(out, inputs, op=dist.ReduceOp.MAX, async_op=async_op), async_op, out)
    _eq(out, torch.full((3,), float(WORLD + c.rank)), "reduce_scatter MAX")


@_check("reduce_scatter_tensor")
def _reduce_scatter_tensor(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    base = torch.arange(WORLD * 4.0)
    mine = base.view(WORLD, 4)[c.rank]
    for op, expect in ((dist.ReduceOp.SUM, 2 * mine + 1), (dist.ReduceOp.AVG, mine + 0.5),
                       (dist.ReduceOp.PREMUL_SUM(0.5), mine + 0.5)):
        for in_shape, out_shape, fn in (((WORLD, 4), (4,), dist.reduce_scatter_tensor),
                                        ((WORLD * 4,), (2, 2), dist.reduce_scatter_single)):  # NCCL: flat layout
            inp = (base + c.rank).to(c.dev).view(in_shape)
            out = torch.empty(out_shape, device=c.dev)
            _done(fn(out, inp, op=op, async_op=async_op), async_op, out)
            _eq(out.reshape(-1), expect, f"{fn.__name__} {op} {in_shape} -> {out_shape}")


@_check("coalesced (all_reduce, all_gather_into_tensor, reduce_scatter_tensor)")
def _coalesced(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    a, b = torch.full((3,), c.rank + 1.0, device=c.dev), torch.full((2,), c.rank + 2.0, device=c.dev)
    with dist._coalescing_manager(async_ops=async_op) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    if async_op:
        cm.wait()
    _eq(a, torch.full((3,), 3.0), "coalesced all_reduce (1st)")
    _eq(b, torch.full((2,), 5.0), "coalesced all_reduce (2nd)")
    outs = [torch.empty(WORLD * 2, device=c.dev), torch.empty(WORLD * 3, device=c.dev)]
    with dist._coalescing_manager(async_ops=async_op) as cm:
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(c.rank), device=c.dev))
        dist.all_gather_into_tensor(outs[1], torch.full((3,), float(c.rank + 5), device=c.dev))
    if async_op:
        cm.wait()
    _eq(outs[0], torch.tensor([0.0, 0, 1, 1]), "coalesced all_gather_into_tensor (1st)")
    _eq(outs[1], torch.tensor([5.0, 5, 5, 6, 6, 6]), "coalesced all_gather_into_tensor (2nd)")
    outs = [torch.empty(2, device=c.dev), torch.empty(1, device=c.dev)]
    with dist._coalescing_manager(async_ops=async_op) as cm:
        dist.reduce_scatter_tensor(outs[0], torch.arange(4.0, device=c.dev) + c.rank)
        dist.reduce_scatter_tensor(outs[1], torch.arange(2.0, device=c.dev) * (c.rank + 1))
    if async_op:
        cm.wait()
    _eq(outs[0], torch.arange(4.0).view(WORLD, 2)[c.rank] * 2 + 1, "coalesced reduce_scatter_tensor (1st)")
    _eq(outs[1], torch.tensor([3.0 * c.rank]), "coalesced reduce_scatter_tensor (2nd)")


@_check("all_to_all_single")
def _all_to_all_single(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    inputs = [torch.arange(4.0) + 10 * r for r in range(WORLD)]
    out = torch.empty(4, device=c.dev)
    _done(dist.all_to_all_single(out, inputs[c.rank].to(c.dev), async_op=async_op), async_op, out)
    _eq(out, torch.cat([x.view(WORLD, 2)[c.rank] for x in inputs]), "all_to_all_single, equal splits")
    in_splits = [[1, 3], [2, 2]]  # rank r sends in_splits[r][k] elements to rank k
    out_splits = [in_splits[k][c.rank] for k in range(WORLD)]
    out = torch.empty(sum(out_splits), device=c.dev)
    _done(dist.all_to_all_single(out, inputs[c.rank].to(c.dev), out_splits, in_splits[c.rank], async_op=async_op),
          async_op, out)
    pieces = [x.split(in_splits[k])[c.rank] for k, x in enumerate(inputs)]
    _eq(out, torch.cat(pieces), "all_to_all_single, unequal splits")


@_check("all_to_all")
def _all_to_all(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    inputs = [torch.full((r + 1,), float(10 * c.rank + r), device=c.dev) for r in range(WORLD)]
    outs = [torch.empty(c.rank + 1, device=c.dev) for _ in range(WORLD)]
    _done(dist.all_to_all(outs, inputs, async_op=async_op), async_op, *outs)
    for k, o in enumerate(outs):
        _eq(o, torch.full((c.rank + 1,), float(10 * k + c.rank)), f"all_to_all from rank {k}")


@_check("barrier")
def _barrier(c: Ctx, async_op: bool) -> None:
    import torch.distributed as dist

    _done(dist.barrier(async_op=async_op), async_op)


@_check("send/recv")
def _send_recv(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    peer = 1 - c.rank
    for sender in range(WORLD):
        t = torch.arange(5.0, device=c.dev) * (sender + 1) if c.rank == sender else torch.empty(5, device=c.dev)
        if async_op:
            work = dist.isend(t, peer) if c.rank == sender else dist.irecv(t, peer)
            assert work.wait() is True
            assert isinstance(work.get_future().wait(), list)
        elif c.rank == sender:
            dist.send(t, peer)
        else:
            dist.recv(t, peer)
        _eq(t, torch.arange(5.0) * (sender + 1), f"send from rank {sender}")


@_check("batch_isend_irecv, receives first", modes=False)
def _batch_p2p(c: Ctx) -> None:
    import torch
    import torch.distributed as dist

    peer = 1 - c.rank
    got = torch.empty(64, 64, device=c.dev)
    mine = torch.full((64, 64), float(c.rank + 1), device=c.dev)
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, peer), dist.P2POp(dist.isend, mine, peer)])
    for w in works:
        w.wait()
    _eq(got, torch.full((64, 64), float(peer + 1)), "batch_isend_irecv")


@_check("gather")
def _gather(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    for dst in range(WORLD):
        outs = [torch.empty(3, device=c.dev) for _ in range(WORLD)] if c.rank == dst else None
        work = dist.gather(torch.full((3,), float(c.rank + 1), device=c.dev), outs, dst=dst, async_op=async_op)
        _done(work, async_op, *(outs or []))
        if c.rank == dst:
            for r, o in enumerate(outs):
                _eq(o, torch.full((3,), float(r + 1)), f"gather to {dst}, part {r}")


@_check("scatter")
def _scatter(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    for src in range(WORLD):
        out = torch.empty(2, 2, device=c.dev)
        parts = [torch.full((2, 2), float(5 * r + src), device=c.dev) for r in range(WORLD)] if c.rank == src else None
        _done(dist.scatter(out, parts, src=src, async_op=async_op), async_op, out)
        _eq(out, torch.full((2, 2), float(5 * c.rank + src)), f"scatter from {src}")


@_check("reduce")
def _reduce(c: Ctx, async_op: bool) -> None:
    import torch
    import torch.distributed as dist

    for dst in range(WORLD):
        for op, expect in ((dist.ReduceOp.SUM, 3.0), (dist.ReduceOp.AVG, 1.5), (dist.ReduceOp.MAX, 2.0)):
            t = torch.full((3,), float(c.rank + 1), device=c.dev)
            _done(dist.reduce(t, dst=dst, op=op, async_op=async_op), async_op, t)
            _eq(t, torch.full((3,), expect if c.rank == dst else float(c.rank + 1)),
                f"reduce {op} to {dst} (non-root untouched, as NCCL)")


@_check("object collectives", modes=False)
def _objects(c: Ctx) -> None:
    import torch.distributed as dist

    got: list = [None] * WORLD
    dist.all_gather_object(got, {"rank": c.rank, "name": f"r{c.rank}"})
    assert got == [{"rank": r, "name": f"r{r}"} for r in range(WORLD)], got
    objs = [("from", c.rank)]
    dist.broadcast_object_list(objs, src=1)
    assert objs == [("from", 1)], objs


@_check("functional collectives (a C++ caller)", modes=False)
def _functional(c: Ctx) -> None:
    import torch
    import torch.distributed as dist

    ops = torch.ops._c10d_functional  # C++ (Functional.cpp): resolves the group by name, calls its allreduce
    name = dist.group.WORLD.group_name
    t = torch.full((3,), float(c.rank + 1), device=c.dev)
    _eq(ops.wait_tensor(ops.all_reduce(t, "avg", name)), torch.full((3,), 1.5), "functional all_reduce avg")
    g = ops.wait_tensor(ops.all_gather_into_tensor(t, WORLD, name))
    _eq(g, torch.tensor([1.0, 1, 1, 2, 2, 2]), "functional all_gather_into_tensor")
    r = ops.wait_tensor(ops.reduce_scatter_tensor(torch.arange(4.0, device=c.dev) + c.rank, "sum", WORLD, name))
    _eq(r, torch.arange(4.0).view(WORLD, 2)[c.rank] * 2 + 1, "functional reduce_scatter_tensor")


@_check("subgroup (new_group)", modes=False)
def _subgroup(c: Ctx) -> None:
    import torch
    import torch.distributed as dist

    g = dist.new_group(list(range(WORLD)))
    assert dist.get_backend(g) == "hccl", dist.get_backend(g)
    t = torch.full((2,), float(c.rank + 1), device=c.dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g)
    _eq(t, torch.full((2,), 1.5), "all_reduce AVG on a subgroup")


def _data(step: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(4 * WORLD, 8, generator=g), torch.randn(4 * WORLD, 4, generator=g)


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


@_check("DDP", modes=False)
def _ddp(c: Ctx) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    ref = _model().to(c.dev)  # the single-process reference: the whole batch, one process
    model = copy.deepcopy(ref)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * c.rank)  # rank 1 starts elsewhere: DDP must broadcast rank 0's parameters
    ddp = DDP(model, device_ids=[c.rank])
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.detach().cpu(), q.detach().cpu()), "DDP did not broadcast rank 0's parameters"
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, y = _data(step)
        mine = slice(4 * c.rank, 4 * (c.rank + 1))
        F.mse_loss(ddp(x[mine].to(c.dev)), y[mine].to(c.dev)).backward()
        F.mse_loss(ref(x.to(c.dev)), y.to(c.dev)).backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert p.grad.device == c.dev
            assert torch.allclose(p.grad.cpu(), q.grad.cpu(), atol=1e-6, rtol=1e-5), \
                f"step {step}: {name}'s gradient differs from the single-process reference"
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    both = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(both, flat)
    assert torch.equal(both[0].cpu(), both[1].cpu()), "the replicas differ after 3 steps"
    ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    assert torch.allclose(flat.cpu(), ref_flat.cpu(), atol=1e-5), "the replicas differ from the reference"


@_check("FSDP2 (fully_shard)", modes=False)
def _fsdp2(c: Ctx) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ref = _model().to(c.dev)
    model = copy.deepcopy(ref)
    mesh = init_device_mesh("npu", (WORLD,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(3):
        x, y = _data(step)
        mine = slice(4 * c.rank, 4 * (c.rank + 1))
        loss = F.mse_loss(model(x[mine].to(c.dev)), y[mine].to(c.dev))
        loss.backward()
        ref_loss = F.mse_loss(ref(x.to(c.dev)), y.to(c.dev))
        ref_loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # equal shards: the mean of the means is the whole mean
        assert torch.allclose(total.cpu(), ref_loss.detach().cpu(), atol=1e-6), \
            f"step {step}: loss {total.item()} vs the single-process reference's {ref_loss.item()}"
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.device == c.dev
        full = p.full_tensor()
        assert torch.allclose(full.cpu(), q.detach().cpu(), atol=1e-5), f"{name} differs from the reference"


def _default_backend_check(rank: int, port: int) -> None:
    """A group made with no backend and a device_id (torchtitan's, accelerate's way) is hccl."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            device_id=torch.device("npu", rank))
    assert dist.get_backend() == "hccl", dist.get_backend()
    t = torch.full((2,), float(rank + 1), device=f"npu:{rank}")
    dist.all_reduce(t)
    _eq(t, torch.full((2,), 3.0), "all_reduce on the default backend")
    dist.barrier()
    dist.destroy_process_group()


DEFAULT_BACKEND = "no backend and device_id: hccl"
NAMES = [*CHECKS, DEFAULT_BACKEND]


def _rank_main(rank: int, port: int, port2: int, out: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from torch_adapter import emulated
    from torch_adapter.routing import profiles

    start = time.perf_counter()
    emulated.start("npu", profiles.load_profile("npu").native, device_count=WORLD)
    torch.npu.set_device(rank)
    dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=40))
    print(f"rank {rank}: started the device and the group in {time.perf_counter() - start:.2f} s", flush=True)
    results: dict[str, str] = {}

    def record(name: str, fn: Callable[[], None]) -> None:
        start = time.perf_counter()
        try:
            fn()
            results[name] = "ok"
        except BaseException as exc:  # noqa: BLE001 - every failure is a result to report
            results[name] = "".join(traceback.format_exception_only(type(exc), exc)).strip() + "\n" + \
                "".join(traceback.format_tb(exc.__traceback__)[-3:])
        print(f"rank {rank}: {name}: {time.perf_counter() - start:.2f} s", flush=True)
        Path(out).write_text(json.dumps(results))

    c = Ctx(rank)
    for name, fn in CHECKS.items():
        record(name, functools.partial(fn, c))
    dist.destroy_process_group()
    record(DEFAULT_BACKEND, functools.partial(_default_backend_check, rank, port2))


# ------------------------------------------------------------------------------------------------
# The tests (pytest's process: it never starts the device itself)

def _can_run() -> bool:
    from torch_adapter import emulated
    from torch_adapter.core import torch_private

    return emulated.is_built() or torch_private.can_build_extensions()


pytestmark = pytest.mark.skipif(not _can_run(), reason="no C++ compiler or ninja here "
                                "(torch_private.can_build_extensions()): the emulated device cannot be built")


def _launch(tmp: Path) -> tuple[dict[int, dict[str, str]], str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    from conftest import free_port  # here, not at the top: each rank runs this file as its script

    port, port2 = free_port(), free_port()
    procs = []
    for rank in range(WORLD):
        log = open(tmp / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen([sys.executable, __file__, str(rank), str(port), str(port2),
                                        str(tmp / f"rank{rank}.json")], stdout=log, stderr=subprocess.STDOUT,
                                       env=env), log))
    deadline = time.monotonic() + 240
    for p, log in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
    results = {r: json.loads((tmp / f"rank{r}.json").read_text()) if (tmp / f"rank{r}.json").exists() else {}
               for r in range(WORLD)}
    logs = "\n".join(f"--- rank {r} (exit {p.returncode}) ---\n" + (tmp / f"rank{r}.log").read_text()[-3000:]
                     for r, (p, _) in enumerate(procs))
    return results, logs


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, dict[str, str]], str]:
    from torch_adapter import emulated

    if not emulated.is_built():  # build once here (in a child: this process never loads the device)
        subprocess.run([sys.executable, "-m", "torch_adapter.emulated", "build"], check=True, timeout=600)
    results, logs = _launch(tmp_path_factory.mktemp("hccl"))
    if "EADDRINUSE" in logs or "address already in use" in logs:  # another test took the free port meanwhile
        results, logs = _launch(tmp_path_factory.mktemp("hccl-retry"))
    return results, logs


@pytest.mark.parametrize("name", NAMES)
def test_on_two_ranks(ranks: tuple[dict[int, dict[str, str]], str], name: str) -> None:
    results, logs = ranks
    for rank in range(WORLD):
        got = results[rank].get(name)
        assert got is not None, f"rank {rank} did not report {name!r}:\n{logs}"
        assert got == "ok", f"rank {rank}, {name}: {got}"


def test_register_is_idempotent_and_maps_the_device() -> None:
    """In a fresh process: hccl is npu's default backend, a second start or register changes nothing."""
    code = (
        "import torch, torch.distributed as dist\n"
        "from torch_adapter import emulated\n"
        "from torch_adapter.emulated import collectives\n"
        "from torch_adapter.routing import profiles\n"
        "emulated.start('npu', profiles.load_profile('npu').native, device_count=2)\n"
        "plugin = dist.Backend._plugins['HCCL']\n"
        "emulated.start('npu', profiles.load_profile('npu').native, device_count=2)\n"
        "collectives.register('npu')\n"
        "assert dist.Backend._plugins['HCCL'] is plugin\n"
        "assert dist.Backend.default_device_backend_map['npu'] == 'hccl'\n"
        "assert dist.Backend.backend_capability['hccl'] == ['npu']\n"
        "assert dist.Backend.backend_list.count('hccl') == 1\n"
        "assert collectives.registered() == {'npu'}\n"
        "print('ok', flush=True)\n"
        # os._exit: start()'s autograd probe runs a backward on the device; torch 2.13's autograd
        # device thread may drop that graph task (and the contextvars context torch stashed with it)
        # while the interpreter finalizes, and abort ('terminate called without an active
        # exception'): not what this test is about
        "import os; os._exit(0)\n"
    )
    env = {**os.environ}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
