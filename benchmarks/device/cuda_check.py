"""The adapter on a real CUDA device (run on a machine with one): target auto must pick cuda, the
CUDA-written step must run natively with nothing redirected away, and trace() must classify the ops
from the live dispatcher. Prints one JSON line (RESULT ...). Run: PYTHONPATH=adapter python benchmarks/device/cuda_check.py"""

import json
import time

import torch

import torch_adapter

out = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
session = torch_adapter.install(target="auto")
out["target"] = session.target.label
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.GroupNorm(4, 32), torch.nn.SiLU(),
                            torch.nn.Flatten(), torch.nn.Linear(32 * 16 * 16, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(16, 3, 16, 16, device="cuda")
y = torch.randint(0, 10, (16,), device="cuda")


def step():
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return loss


for _ in range(3):
    step()
torch.cuda.synchronize()
with torch_adapter.trace() as log:
    loss = step()
    torch.cuda.synchronize()
out["summary"] = log.summary()
out["non_native"] = sorted({(r["op"], r["route"]) for r in log.table() if r["route"] not in ("native",)})[:30]
out["device"] = str(x.device)
out["loss"] = loss.item()
t = time.perf_counter()
for _ in range(20):
    step()
torch.cuda.synchronize()
out["adapted_ms"] = (time.perf_counter() - t) / 20 * 1e3
torch_adapter.uninstall()
t = time.perf_counter()
for _ in range(20):
    step()
torch.cuda.synchronize()
out["plain_ms"] = (time.perf_counter() - t) / 20 * 1e3
print("RESULT " + json.dumps(out, default=str))
