"""Multi-process training started from a notebook: accelerate's ``notebook_launcher`` in a real kernel.

The launcher forks ranks from the kernel (``start_method="fork"`` where it sees CUDA), so they inherit
the adapter the kernel loaded with ``%load_ext torch_adapter``; their "nccl" group is gloo. The training
function gathers (B, C) logits with ``accelerator.gather`` (a flat output, as nccl takes it: the case
``redirect/distributed.py`` hands to gloo in its own layout). After the launch the kernel's session is
still the one the notebook loaded and its next cell reports its routing. The kernel starts with an
empty start-up cache (a first run): see tests/test_fork_safety.py for why that matters.
"""

from __future__ import annotations

import re

import nbformat
from nbclient import NotebookClient

from conftest import free_port

MIME = "application/vnd.torch-adapter.routing+json"
JOB = "application/vnd.torch-adapter.job+json"

TRAIN = '''
import torch
from accelerate import notebook_launcher

def train():
    import torch, torch.nn as nn
    from accelerate import Accelerator
    acc = Accelerator(mixed_precision="fp16")
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,))),
                                       batch_size=4)
    model, opt, data = acc.prepare(model, opt, data)
    for x, y in data:
        logits = model(x)
        acc.backward(nn.functional.cross_entropy(logits, y))
        opt.step()
        opt.zero_grad()
    gathered = acc.gather(logits)                    # (4, 3) per rank -> (8, 3)
    weights = acc.gather(acc.unwrap_model(model).weight.detach())   # (3, 8) per rank: DDP kept them equal
    print(f"rank {acc.process_index}/{acc.num_processes} on {acc.device} with "
          f"{torch.distributed.get_backend()}: logits {tuple(gathered.shape)}, "
          f"weights equal {torch.equal(weights[:3], weights[3:])}", flush=True)

notebook_launcher(train, num_processes=2, use_port="{port}")  # not 29500: other tests' launchers
'''

CELLS = ["%load_ext torch_adapter", TRAIN,  # TRAIN gets a free port
         "x = torch.ones(2, device='cuda') * 3\nprint('after the launch:', x.device, torch.cuda.is_available())"]


def test_notebook_launcher_trains_two_ranks_from_an_adapted_kernel(tmp_path, monkeypatch):
    # an empty start-up cache: the kernel's %load_ext does its first-run work (the speed check where
    # bfloat16 units are), which once started OpenMP's team in the kernel and hung the forked ranks
    monkeypatch.setenv("TORCH_ADAPTER_CACHE_DIR", str(tmp_path / "cache"))
    port = free_port()  # the suite's one port helper (conftest)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src.replace("{port}", str(port))) for src in CELLS]
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.get("output_type") == "stream")
    assert "Launching training on 2 CUDAs." in text, text
    ranks = re.findall(r"rank (\d)/2 on cuda:(\d) with gloo: logits \(8, 3\), weights equal True", text)
    assert sorted(ranks) == [("0", "0"), ("1", "1")], text
    # the ranks the cell forked, as one job report under it (jupyter/forked_ranks.py)
    (job,) = [o["data"][JOB] for o in nb.cells[1].outputs if JOB in o.get("data", {})]
    assert [r["rank"] for r in job["ranks"]] == [0, 1] and job["ok"] and job["world_size"] == 2, job
    assert all(r["routes"]["native"] > 0 and r["op_calls"].get("native c10d::allreduce_", 0) > 0
               for r in job["ranks"]), job["ranks"]
    assert len({r["pid"] for r in job["ranks"]}) == 2 and job["stragglers"] == [], job
    html = next(o["data"]["text/html"] for o in nb.cells[1].outputs if JOB in o.get("data", {}))
    assert "the ranks this cell launched: 2 adapted rank(s) of 2" in html
    assert not [o for o in nb.cells[2].outputs if JOB in o.get("data", {})]  # a cell that forks none shows none
    after = "".join(o.get("text", "") for o in nb.cells[2].outputs if o.get("output_type") == "stream")
    assert "after the launch: cpu True" in after
    reports = [o["data"][MIME] for o in nb.cells[2].outputs if MIME in o.get("data", {})]
    assert len(reports) == 1 and reports[0]["counts"]["native"] > 0
