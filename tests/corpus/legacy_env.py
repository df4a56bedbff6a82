"""Environment variables CUDA scripts set, and branches on the device type."""
import os

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
import torch

x = torch.randn(3).cuda()
# Semantics chosen by torch_adapter: tensors report where they really are.
on_cuda = x.is_cuda
kind = x.device.type
print("legacy OK", on_cuda, kind, torch.cuda.device_count())
