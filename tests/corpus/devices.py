"""Every spelling of a CUDA device a real script uses."""
import io

import torch
import torch.nn as nn

assert torch.cuda.is_available()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dev0 = torch.device("cuda", 0)
local_rank = 0

a = torch.zeros(2, 3, device="cuda")
b = torch.ones(2, 3, device="cuda:0")
c = torch.randn(2, 3, device=dev0)
d = torch.arange(6, device=device).view(2, 3)
e = torch.empty(2, 3, device=local_rank)
f = torch.full((2, 3), 7.0, device=f"cuda:{local_rank}")
g = torch.tensor([1.0, 2.0], device="cuda")
h = torch.linspace(0, 1, 5, device="cuda")
i = torch.randint(0, 10, (3,), device="cuda")
j = torch.eye(3, device="cuda")
k = torch.zeros_like(a, device="cuda")
l = torch.randn_like(a, device="cuda:0")
m = a.new_zeros((4,), device="cuda")
n = a.new_tensor([1, 2, 3], device="cuda")
o = torch.randperm(5, device="cuda")
for t in (a, b, c, d, e, f, g, h, i, j, k, l, m, n, o):
    assert t.device.type != "cuda", t.device

x = torch.randn(4, 4)
y = x.cuda()
y1 = x.cuda(0)
y2 = x.cuda(non_blocking=True)
z = x.to("cuda")
z1 = x.to("cuda:0", non_blocking=True)
z2 = x.to(device=dev0, dtype=torch.float64)
z3 = x.to(0)
z4 = x.to(dev0, torch.float16)
z5 = x.pin_memory().to(device, non_blocking=True)
assert z2.dtype == torch.float64 and z4.dtype == torch.float16
assert torch.equal(y.cpu(), x) and torch.equal(z.cpu(), x)

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
model.cuda()
model.to("cuda:0")
model.to(device)
model = model.to(device=dev0)
out = model(x.cuda())
assert out.shape == (4, 2)
meta = nn.Linear(3, 3, device="meta")
meta.to_empty(device="cuda")
assert meta.weight.device.type != "meta"

torch.set_default_device("cuda")
p = torch.zeros(3)
torch.set_default_device("cpu")
with torch.device("cuda"):
    q = torch.ones(2)
    lin = nn.Linear(2, 2)
assert p.device.type != "cuda" and q.device.type != "cuda" and lin.weight.device.type != "cuda"

gen = torch.Generator(device="cuda")
gen.manual_seed(0)
r1 = torch.randn(3, generator=gen, device="cuda")
gen.manual_seed(0)
r2 = torch.randn(3, generator=gen, device="cuda")
assert torch.equal(r1, r2) and isinstance(gen, torch.Generator)

buf = io.BytesIO()
torch.save(model.state_dict(), buf)
for loc in ("cuda", "cuda:0", torch.device("cuda"), {"cuda:0": "cuda:0"},
            lambda storage, loc: storage.cuda(), None):
    buf.seek(0)
    sd = torch.load(buf, map_location=loc) if loc is not None else torch.load(buf)
    model.load_state_dict(sd)

print("devices OK", out.device)
