"""``device_count``: how many CUDA devices the CPU target shows (every CUDA index names the CPU).

A program that asks for N GPUs — Lightning's ``Trainer(devices=2, strategy="ddp")``, which refuses
to start unless ``torch.cuda.device_count() >= 2`` and then launches the other ranks itself, or
``mp.spawn(fn, nprocs=torch.cuda.device_count())`` — runs its N ranks on the CPU with
``install(device_count=N)`` / ``torch-adapter run --device-count N``. Without it: 1, or one per
local rank under a launcher (``LOCAL_WORLD_SIZE``).
"""

from __future__ import annotations

import importlib.util
import re
import textwrap

import pytest
import torch

import torch_adapter
from conftest import free_port, run_cli
from torch_adapter.errors import UsageError


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    yield
    torch_adapter.uninstall()


def test_the_cpu_target_shows_the_count_asked_for_and_every_index_names_the_cpu():
    before = torch.cuda.device_count()
    torch_adapter.install("cpu", device_count=3)
    assert torch.cuda.device_count() == torch.accelerator.device_count() == 3
    x = torch.ones(2, device="cuda:2")
    assert x.device.type == "cpu"
    torch.cuda.set_device(2)
    assert torch.cuda.current_device() == 2
    assert torch.cuda.get_device_properties(2).total_memory > 0
    torch_adapter.configure(device_count=2)  # read per call: at once
    assert torch.cuda.device_count() == 2
    torch_adapter.configure(device_count=None)
    assert torch.cuda.device_count() == 1
    torch_adapter.uninstall()
    assert torch.cuda.device_count() == before


def test_it_overrides_the_launchers_count_and_the_launchers_count_is_the_default(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    torch_adapter.install("cpu")
    assert torch.cuda.device_count() == 4
    torch_adapter.configure(device_count=2)
    assert torch.cuda.device_count() == 2


def test_a_simulated_target_runs_on_the_cpu_so_it_takes_the_count_too():
    torch_adapter.install("mps", simulate=True, device_count=2)
    assert torch.cuda.device_count() == 2


@pytest.mark.parametrize("bad", [0, -1, True, "2", 1.5])
def test_a_count_that_is_not_a_whole_number_of_devices_is_refused(bad):
    with pytest.raises(UsageError) as err:
        torch_adapter.install("cpu", device_count=bad)
    text = str(err.value)
    assert "device_count" in text and "whole number of devices >= 1" in text and repr(bad) in text
    assert torch_adapter.current() is None  # nothing was installed


def test_configure_with_a_bad_count_leaves_the_session_as_it_was():
    torch_adapter.install("cpu", device_count=2)
    with pytest.raises(UsageError):
        torch_adapter.configure(device_count=0)
    assert torch.cuda.device_count() == 2


def test_a_target_with_devices_of_its_own_refuses_it():
    """On npu/xpu/mps every CUDA index names one of the target's devices: their count is the answer."""
    from torch_adapter.core.config import make_config
    from torch_adapter.routing.target import Target
    from torch_adapter.session import _check_policy

    npu = Target(name="npu", device_type="npu", dispatch_key="PrivateUse1", dist_backend="hccl", device_count=1)
    with pytest.raises(UsageError) as err:
        _check_policy(npu, make_config({"device_count": 2}))
    assert "device_count=2 on target 'npu'" in str(err.value) and "cpu" in str(err.value)
    _check_policy(npu, make_config({}))  # unset: fine


def test_the_cli_refuses_a_bad_count_with_a_usage_error(tmp_path):
    (tmp_path / "s.py").write_text("print('ran')\n")
    res = run_cli("run", "--device-count", "none", str(tmp_path / "s.py"), cwd=tmp_path)
    assert res.returncode == 2 and "ran" not in res.stdout
    assert "--device-count: expected a whole number of devices >= 1, got 'none'" in res.stderr


SPAWN_OVER_DEVICES = textwrap.dedent("""
    import os, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP

    def worker(rank, world):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
        dist.init_process_group("nccl", rank=rank, world_size=world)
        torch.cuda.set_device(rank)
        torch.manual_seed(rank)
        model = DDP(torch.nn.Linear(4, 1).cuda(rank), device_ids=[rank])
        model(torch.randn(8, 4, device=f"cuda:{rank}")).sum().backward()
        grad = model.module.weight.grad.clone()
        others = [torch.empty_like(grad) for _ in range(world)]
        dist.all_gather(others, grad)
        same = all(torch.equal(grad, g) for g in others)
        print(f"rank {rank}/{world} sees {torch.cuda.device_count()} devices, backend {dist.get_backend()}, "
              f"gradients averaged: {same}", flush=True)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(torch.cuda.device_count(),), nprocs=torch.cuda.device_count())
""")



def test_mp_spawn_over_device_count_starts_that_many_ddp_ranks(tmp_path):
    port = free_port()
    (tmp_path / "spawn.py").write_text(SPAWN_OVER_DEVICES)
    res = run_cli("run", "--device-count", "2", str(tmp_path / "spawn.py"), cwd=tmp_path, timeout=300,
                  env={"PORT": str(port)})
    # (a rank's SIGABRT at exit, "terminate called without an active exception", was retried here:
    # torch's gloo worker dropping its last work while the interpreter finalized; the adapter now
    # settles it at exit — redirect/distributed.py, GLOO_EXIT_SETTLE_S)
    assert res.returncode == 0, res.stdout[-2000:] + "\n" + res.stderr[-6000:]
    for rank in (0, 1):
        assert f"rank {rank}/2 sees 2 devices, backend gloo, gradients averaged: True" in res.stdout, res.stdout


LIGHTNING = textwrap.dedent("""
    import sys, torch, torch.nn as nn, torch.nn.functional as F
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
        def forward(self, x):
            return self.net(x)
        def training_step(self, batch, i):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss
        def validation_step(self, batch, i):
            x, y = batch
            self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=True)
        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    if __name__ == "__main__":
        devices, strategy = int(sys.argv[1]), sys.argv[2]
        torch.manual_seed(0)
        x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 3, (64,))
        trainer = L.Trainer(accelerator="gpu", devices=devices, strategy=strategy, precision="16-mixed",
                            max_epochs=2, default_root_dir="out", logger=False, enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.fit(Net(), DataLoader(TensorDataset(x, y), batch_size=16), DataLoader(TensorDataset(x, y), batch_size=32))
        scaler = trainer.precision_plugin.scaler
        print(f"rank {trainer.global_rank}/{trainer.world_size} on {trainer.strategy.root_device} "
              f"scaler {type(scaler).__name__} val_loss {trainer.callback_metrics['val_loss'].item():.6f} "
              f"steps {trainer.global_step}", flush=True)
        if trainer.global_rank == 0:
            best = Net.load_from_checkpoint(trainer.checkpoint_callback.best_model_path, map_location="cuda")
            print("reloaded on", next(best.parameters()).device, flush=True)
""")


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning (pip install -e .[dev])")
@pytest.mark.parametrize("devices,strategy", [(1, "auto"), (2, "ddp"), (2, "fsdp")], ids=["one-gpu", "ddp-2", "fsdp-2"])
def test_a_lightning_trainer_asking_for_gpus_trains_on_the_cpu(tmp_path, devices, strategy):
    """Lightning's CUDA accelerator, 16-mixed AMP (GradScaler "cuda"; FSDP's ShardedGradScaler), and
    for ddp/fsdp its own launcher: it re-runs the script for rank 1 (adapted through propagate, with
    the same device count) and picks "nccl" for cuda devices (gloo here). FSDP (FSDP1 underneath) gets
    ``device_id=cuda:<rank>``: before redirect/distributed.py mapped it, "Inconsistent compute device
    and `device_id` on rank 1: cuda:0 vs cuda:1"."""
    (tmp_path / "lit.py").write_text(LIGHTNING)
    res = run_cli("run", "--device-count", str(devices), str(tmp_path / "lit.py"), str(devices), strategy,
                  cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = re.findall(r"rank (\d)/(\d) on (\S+) scaler (\w+) val_loss ([\d.]+) steps (\d+)", res.stdout)
    assert sorted(r[0] for r in ranks) == [str(r) for r in range(devices)], res.stdout + res.stderr[-3000:]
    for rank, world, device, scaler, _, steps in ranks:
        assert world == str(devices) and device == f"cuda:{rank}" and scaler.endswith("GradScaler")
        assert int(steps) == 2 * 64 // (16 * devices)  # two epochs of the rank's shard of the batches
    assert len({r[4] for r in ranks}) == 1  # sync_dist: every rank logs the same validation loss
    assert "reloaded on cpu" in res.stdout
