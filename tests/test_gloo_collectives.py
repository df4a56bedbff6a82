"""Collectives a program wrote for nccl, run on the gloo group the adapter chose in its place.

``all_gather_into_tensor`` (accelerate's ``gather`` / ``gather_for_metrics``): nccl takes any output with
world_size × the input's elements — accelerate passes a flat one — while gloo wants the inputs'
concatenation along dim 0, so gathering (B, C) logits failed under the adapter with "invalid tensor size
at index 0 (expected (1, 16), got (16))". Two real gloo ranks (``mp.spawn``) check the nccl layout now
works on the adapter's gloo group, and that a gloo group the program asked for itself is left as plain
torch has it.
"""

from __future__ import annotations

import socket
import textwrap

from conftest import run_cli

SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

    def worker(rank, world, backend):
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{os.environ['PORT']}", rank=rank,
                                world_size=world)
        x = torch.arange(6, dtype=torch.float32, device=f"cuda:{rank}").reshape(2, 3) + 10 * rank
        x.requires_grad_()                                       # a live tensor, as a loss or logits are
        flat = torch.empty(world * x.numel(), device=f"cuda:{rank}")   # accelerate's _gpu_gather_one
        try:
            dist.all_gather_into_tensor(flat, x)
        except RuntimeError as exc:
            print(f"rank {rank} {backend}: refused: {str(exc).splitlines()[0][:80]}", flush=True)
        else:
            expect = torch.cat([torch.arange(6.).reshape(2, 3) + 10 * r for r in range(world)])
            print(f"rank {rank} {backend}: gathered {torch.equal(flat.view(-1, 3), expect)}", flush=True)
        stacked = torch.empty(world * 2, 3, device=f"cuda:{rank}")   # the layout both accept
        dist.all_gather_into_tensor(stacked, x.detach())
        print(f"rank {rank} {backend}: concatenated {torch.equal(stacked[2 * rank:2 * rank + 2], x.detach())}",
              flush=True)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
""")


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_a_flat_output_gathers_on_the_gloo_group_that_replaced_nccl(tmp_path):
    (tmp_path / "g.py").write_text(SCRIPT)
    res = run_cli("run", str(tmp_path / "g.py"), "nccl", cwd=tmp_path, timeout=300, env={"PORT": _port()})
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} nccl: gathered True" in res.stdout, res.stdout + res.stderr[-2000:]
        assert f"rank {rank} nccl: concatenated True" in res.stdout


def test_a_gloo_group_the_program_asked_for_keeps_gloos_own_rules(tmp_path):
    (tmp_path / "g.py").write_text(SCRIPT)
    res = run_cli("run", str(tmp_path / "g.py"), "gloo", cwd=tmp_path, timeout=300, env={"PORT": _port()})
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} gloo: refused: " in res.stdout, res.stdout + res.stderr[-2000:]
        assert f"rank {rank} gloo: concatenated True" in res.stdout
