import torch
import torch.backends.cudnn as cudnn  # expect: API014
import torch.distributed as dist
from torch.cuda import Stream  # expect: API007
from torch.utils.cpp_extension import CUDA_HOME  # expect: EXT004


def pick_device(x):
    if x.is_cuda:  # expect: DEV009
        return x.device
    if x.device.type == "cuda":  # expect: DEV010
        return "gpu"
    if str(x.device).startswith("cuda"):  # expect: DEV010
        return "gpu"
    return "cuda" if torch.cuda.is_available() else "cpu"  # expect: API001


def collective_kind():
    backend = dist.get_backend()
    if backend == "nccl":  # expect: DIST003
        return "gpu"
    return backend


def capabilities():
    major, minor = torch.cuda.get_device_capability()  # expect: API011
    bf16 = major >= 8 and torch.version.cuda is not None  # expect: API011
    cudnn = torch.backends.cudnn.version()  # expect: API011
    return bf16, cudnn, CUDA_HOME  # expect: EXT004


def to_device(batch, device="cuda"):  # expect: DEV011
    return {k: v.to(device) for k, v in batch.items()}


cudnn.benchmark = True  # expect: API014
legacy = torch.cuda.FloatTensor(3)  # expect: API012
half = torch.zeros(2).type("torch.cuda.HalfTensor")  # expect: API012
torch.cuda.nccl.version()  # expect: API013
