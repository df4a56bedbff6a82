"""Collectives a program wrote for nccl, run on the gloo groups the adapter chose in its place.

nccl takes shapes and ops gloo refuses, and CUDA-written programs rely on them:

- ``all_gather_into_tensor`` into a flat output (accelerate's ``gather`` / ``gather_for_metrics``): gloo
  wants the inputs concatenated along dim 0 — gathering (B, C) logits failed with "invalid tensor size at
  index 0 (expected (1, 16), got (16))";
- ``reduce_scatter_tensor`` from a (world, n) stack: gloo checked ``outputShape[0] * worldSize ==
  inputShape[0]``;
- ``ReduceOp.PREMUL_SUM(factor)`` (nccl-only; FSDP2's ``set_gradient_divide_factor``): "Cannot use
  ReduceOp.PREMUL_SUM with Gloo".

Two real gloo ranks (``mp.spawn``) check each on the adapter's gloo group, on a subgroup made with no
backend (a DeviceMesh's, FSDP2's), and that a gloo group the program asked for itself keeps gloo's rules.
"""

from __future__ import annotations

import re
import textwrap

from conftest import free_port, run_cli

SCRIPT = textwrap.dedent("""
    import copy, os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.distributed.fsdp import fully_shard

    def attempt(rank, name, fn):
        try:
            print(f"rank {rank} {name}: {fn()}", flush=True)
        except RuntimeError as exc:
            print(f"rank {rank} {name}: refused ({str(exc).splitlines()[0][:60]})", flush=True)

    def worker(rank, world, backend):
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{os.environ['PORT']}", rank=rank,
                                world_size=world)
        dev = f"cuda:{rank}"
        sub = dist.new_group(list(range(world)))                 # no backend: inherits the default group's

        def gather(group=None):
            x = (torch.arange(6., device=dev).reshape(2, 3) + 10 * rank).requires_grad_()   # live logits
            flat = torch.empty(world * x.numel(), device=dev)    # accelerate's _gpu_gather_one
            dist.all_gather_into_tensor(flat, x, group=group)
            expect = torch.cat([torch.arange(6.).reshape(2, 3) + 10 * r for r in range(world)])
            return torch.equal(flat.view(-1, 3), expect)

        def reduce_scatter(group=None):
            stacked = (torch.arange(4., device=dev) + rank).view(world, 2)
            out = torch.empty(2, device=dev)
            dist.reduce_scatter_tensor(out, stacked, group=group)
            return torch.equal(out, torch.arange(4.).view(world, 2)[rank] * 2 + 1)  # the sum of both ranks

        def premul(group=None):
            t = torch.ones(2, device=dev) * (rank + 1)
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=group)
            return torch.equal(t, torch.full((2,), 0.5 * sum(r + 1 for r in range(world))))

        def fsdp2_divide_factor():
            torch.manual_seed(0)
            reference = torch.nn.Linear(8, 4).to(dev)
            model = copy.deepcopy(reference)
            fully_shard(model)
            model.set_gradient_divide_factor(4.0)                # PREMUL_SUM(1/4) in its reduce-scatter
            x = torch.randn(6, 8, generator=torch.Generator().manual_seed(rank)).to(dev)
            model(x).sum().backward()
            reference(x).sum().backward()
            expect = reference.weight.grad.clone()
            dist.all_reduce(expect)
            return torch.allclose(model.weight.grad.full_tensor(), expect / 4, atol=1e-6)

        for name, fn in (("gather", gather), ("reduce_scatter", reduce_scatter), ("premul", premul)):
            attempt(rank, name, fn)
            attempt(rank, name + " on a subgroup", lambda: fn(sub))
        if backend == "nccl":
            attempt(rank, "fsdp2 divide factor", fsdp2_divide_factor)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
""")


def _run(tmp_path, backend):
    port = str(free_port())  # the suite's one port helper (conftest)
    (tmp_path / "g.py").write_text(SCRIPT)
    res = run_cli("run", str(tmp_path / "g.py"), backend, cwd=tmp_path, timeout=300, env={"PORT": port})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res.stdout


def test_nccl_shapes_and_ops_work_on_the_gloo_groups_that_replaced_nccl(tmp_path):
    out = _run(tmp_path, "nccl")
    for rank in (0, 1):
        for name in ("gather", "reduce_scatter", "premul"):
            assert f"rank {rank} {name}: True" in out, out
            assert f"rank {rank} {name} on a subgroup: True" in out, out
        assert f"rank {rank} fsdp2 divide factor: True" in out, out


def test_a_gloo_group_the_program_asked_for_keeps_gloos_own_rules(tmp_path):
    out = _run(tmp_path, "gloo")
    for rank in (0, 1):
        for name in ("gather", "reduce_scatter", "premul"):
            assert re.search(rf"rank {rank} {name}: refused", out), out


FSDP1 = textwrap.dedent("""
    import functools, os, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, MixedPrecision
    from torch.distributed.fsdp import StateDictType
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    def worker(rank, world):
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{os.environ['PORT']}", rank=rank,
                                world_size=world)
        torch.cuda.set_device(rank)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda()
        reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model = FSDP(model, device_id=torch.cuda.current_device(),
                     mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                     auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=100))
        with FSDP.summon_full_params(model, offload_to_cpu=True):   # the program's way to look at weights
            same = all(torch.equal(p.detach(), reference[n.replace("_fsdp_wrapped_module.", "")])
                       for n, p in model.named_parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(2):
            model(torch.randn(8, 16, device="cuda")).float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
            full = model.state_dict()
        print(f"rank {rank} fsdp1: summoned weights as made {same}, full state dict keys {len(full)}, "
              f"trained {not torch.equal(full.get('0.weight', reference['0.weight']), reference['0.weight'])}",
              flush=True)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(2,), nprocs=2)
""")


def test_fsdp1_written_for_cuda_trains_and_saves_a_full_checkpoint(tmp_path):
    """FSDP1 with ``device_id=torch.cuda.current_device()``, bfloat16 mixed precision, and a full state
    dict offloaded to rank 0 (its usual save): the device id names the target's device, and unsharding
    "to the CPU" where the compute device is the CPU unshards in place (torch's offload path freed the
    parameters' storage there). Rank 0 holds the 4 tensors, rank 1 none (rank0_only)."""
    port = str(free_port())  # the suite's one port helper (conftest)
    (tmp_path / "f.py").write_text(FSDP1)
    res = run_cli("run", "--device-count", "2", str(tmp_path / "f.py"), cwd=tmp_path, timeout=300, env={"PORT": port})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "rank 0 fsdp1: summoned weights as made True, full state dict keys 4, trained True" in res.stdout, res.stdout
    assert "rank 1 fsdp1: summoned weights as made True, full state dict keys 0, trained False" in res.stdout
