"""DDP written for NCCL, launched by torchrun (env:// rendezvous)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group(backend="nccl")
device = torch.device("cuda", local_rank)
model = nn.Linear(4, 2).to(device)
ddp = DDP(model, device_ids=[local_rank])
loss = ddp(torch.randn(8, 4, device=device)).sum()
loss.backward()
g = model.weight.grad.clone()
gathered = [torch.zeros_like(g) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, g)
assert all(torch.allclose(gathered[0], x) for x in gathered)
print(f"rank {dist.get_rank()} torchrun OK {dist.get_backend()}")
dist.destroy_process_group()
