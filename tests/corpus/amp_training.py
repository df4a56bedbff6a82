"""A mixed-precision training loop, the way CUDA scripts write it."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.cuda.amp import GradScaler, autocast


class MyFn(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, g):
        return g * 2


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = GradScaler()
scaler2 = torch.amp.GradScaler("cuda")
x = torch.randn(8, 16).cuda(non_blocking=True)
y = torch.randint(0, 4, (8,)).cuda()
losses = []
for step in range(5):
    opt.zero_grad(set_to_none=True)
    with autocast(dtype=torch.float16):
        logits = model(x)
        assert logits.dtype in (torch.float16, torch.bfloat16), logits.dtype
        loss = F.cross_entropy(logits.float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    losses.append(loss.item())
with torch.autocast("cuda", dtype=torch.bfloat16):
    assert torch.is_autocast_enabled() and torch.is_autocast_enabled("cuda")
    assert torch.get_autocast_dtype("cuda") == torch.bfloat16
    out = MyFn.apply(torch.randn(3, requires_grad=True).cuda())
with torch.autocast(device_type="cuda", enabled=False):
    assert not torch.is_autocast_enabled("cuda")
assert losses[-1] < losses[0], losses
print("amp OK", [round(v, 3) for v in losses])
