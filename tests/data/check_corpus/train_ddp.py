"""DDP training script written for CUDA (corpus for torch-adapter check).

Mentions of cuda in this docstring are not findings.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0,1")  # expect: ENV001
os.environ["NCCL_DEBUG"] = "INFO"  # expect: ENV003
os.environ["CUDA_LAUNCH_BLOCKING"] = "1"  # expect: ENV002
torch.backends.cudnn.benchmark = True  # expect: API014
torch.backends.cudnn.deterministic = False  # expect: API014
torch.backends.cuda.matmul.allow_tf32 = True  # expect: API017
torch.set_float32_matmul_precision("high")  # expect: API019


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")  # expect: DEV011
    p.add_argument("--no-cuda", action="store_true")  # expect: ANY003
    p.add_argument("--backend", default="nccl")  # expect: DIST005
    return p.parse_args()


def setup(args):
    # the cuda device is chosen from LOCAL_RANK (comment: not a finding)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dist.init_process_group("nccl", rank=0, world_size=1)  # expect: DIST001
    torch.cuda.set_device(local_rank)  # expect: API003
    device = torch.device(f"cuda:{local_rank}")  # expect: DEV003
    use_cuda = not args.no_cuda and torch.cuda.is_available()  # expect: API001
    if use_cuda:  # expect: ANY002
        print("GPUs:", torch.cuda.device_count())  # expect: API002
    return local_rank, device


def main():
    args = parse()
    local_rank, device = setup(args)
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)  # expect: API005
    model = nn.Linear(8, 1).cuda()  # expect: DEV001
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # expect: DIST006
    model = DDP(
        model,
        device_ids=[local_rank],  # expect: DEV008
        output_device=local_rank,  # expect: DEV008
    )
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, pin_memory=True)  # expect: DEV005
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")  # expect: AMP006
    for x, y in loader:
        x = x.to(device, non_blocking=True)  # expect: DEV006
        y = y.cuda(local_rank, non_blocking=True)  # expect: DEV001,DEV006
        with torch.autocast(device_type="cuda", dtype=torch.float16):  # expect: AMP005
            loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()  # expect: AMP007
        scaler.step(opt)  # expect: AMP007
        scaler.update()  # expect: AMP007
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "model.pt")
        state = torch.load("model.pt", map_location="cuda:0")  # expect: DEV004
        print(len(state))
    torch.cuda.empty_cache()  # expect: API006
    dist.barrier(device_ids=[local_rank])  # expect: DEV008
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
