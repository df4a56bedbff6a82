"""DDP written for NCCL, started with mp.spawn (children are fresh interpreters)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank, world_size, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    assert dist.get_backend() in ("gloo", "nccl", "hccl", "xccl"), dist.get_backend()
    torch.manual_seed(rank)  # different data per rank, same initial weights below
    model = nn.Linear(8, 4).cuda(rank)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.1)
    ddp = DDP(model, device_ids=[rank], output_device=rank)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = ddp(torch.randn(16, 8, device=f"cuda:{rank}")).pow(2).mean()
        loss.backward()
        opt.step()
    t = torch.ones(1, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    dist.barrier()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    torch.save({"params": flat, "sum": t.item(), "backend": dist.get_backend()},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    out_dir, port = sys.argv[1], int(sys.argv[2])
    world = 2
    mp.spawn(worker, args=(world, port, out_dir), nprocs=world, join=True)
    r0 = torch.load(os.path.join(out_dir, "rank0.pt"))
    r1 = torch.load(os.path.join(out_dir, "rank1.pt"))
    assert r0["sum"] == r1["sum"] == 3.0
    assert torch.equal(r0["params"], r1["params"]), "DDP replicas diverged"
    print("ddp spawn OK", r0["backend"])
