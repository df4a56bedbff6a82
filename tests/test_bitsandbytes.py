"""bitsandbytes under the adapter (issue 35): `import bitsandbytes` took its CUDA path once
``torch.cuda.is_available()`` was True and failed binding ``torch._C._cuda_getCurrentRawStream``, a private
binding a CPU build of torch lacks (redirect/cuda_bindings.py answers it). Its 8-bit AdamW — the
optimizer the most used Stable Diffusion LoRA scripts name — then trains a CUDA-written model on the
target with its CPU kernels, states in 8 bits. A real run in a fresh interpreter, as a user runs it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install bitsandbytes)")

SCRIPT = """\
import json, torch
import bitsandbytes as bnb
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 256).cuda(), torch.randn(64, 1).cuda()
losses = []
for step in range(30):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
state = opt.state[model[0].weight]
print("RESULT " + json.dumps({"losses": losses, "device": str(model[0].weight.device),
                              "state": {k: str(v.dtype) for k, v in state.items() if torch.is_tensor(v)}}))
"""


def test_import_and_8bit_adamw_train_on_the_target(tmp_path, cli):
    script = tmp_path / "train_8bit.py"
    script.write_text(SCRIPT)
    p = cli("run", str(script))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "_cuda_getCurrentRawStream" not in p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    got = json.loads(line[7:])
    assert got["device"] == "cpu"
    assert got["state"]["state1"] == "torch.uint8" and got["state"]["state2"] == "torch.uint8"  # 8-bit states
    assert got["losses"][-1] < 0.5 * got["losses"][0], got["losses"]  # it trains
