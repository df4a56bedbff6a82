"""Profiling with CUDA activities, SDPA backend selection, cuDNN flags."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, record_function

torch.backends.cudnn.benchmark = True
q = k = v = torch.randn(2, 4, 16, 8, device="cuda")
with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
    out = F.scaled_dot_product_attention(q, k, v)
with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
    out2 = F.scaled_dot_product_attention(q, k, v, is_causal=True)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
    with record_function("attention"):
        F.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=5)
assert "attention" in table
print("profiler OK", out.shape, out2.shape)
