"""DeepSpeed written for CUDA, under ``torch-adapter run deepspeed --num_gpus 2`` (its own launcher).

DeepSpeed picks its CUDA accelerator where ``torch.cuda.is_available()`` (the adapter's answer: True),
asks it for streams, events, memory and the communication backend ("nccl" → gloo), and trains the
ZeRO stages over two real ranks. An fp16 config was refused — "Type fp16 is not supported on your
device": its accelerator checks compute capability ≥ 7.0 and the CPU target answers (0, 0) — until the
probe table answered ``CUDA_Accelerator.is_fp16_supported`` for the target (redirect/probes.py).
"""

from __future__ import annotations

import re
import textwrap

import pytest

from conftest import free_port, run_cli

pytest.importorskip("deepspeed")

SCRIPT = textwrap.dedent("""
    import argparse, torch, deepspeed
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--dtype", default="bf16")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              args.dtype: {"enabled": True, **({"initial_scale_power": 8} if args.dtype == "fp16" else {})},
              "zero_optimization": {"stage": args.stage}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    before = [p.detach().float().clone() for p in engine.module.parameters()] if args.stage < 3 else None
    for step in range(3):
        x = torch.randn(4, 16, device=engine.device, dtype=dtype)
        y = torch.randint(0, 4, (4,), device=engine.device)
        loss = torch.nn.functional.cross_entropy(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint("ckpt")
    moved = before is None or any(not torch.equal(b, p.detach().float()) for b, p in zip(before, engine.module.parameters()))
    print(f"rank {engine.global_rank}/{engine.world_size} on {engine.device} {args.dtype} zero {args.stage}: "
          f"loss {loss.item():.4f} trained {moved} backend {torch.distributed.get_backend()}", flush=True)
""")


@pytest.mark.parametrize("stage,dtype", [(1, "fp16"), (2, "bf16"), (3, "bf16")], ids=["zero1-fp16", "zero2-bf16", "zero3-bf16"])
def test_deepspeed_zero_trains_two_ranks_on_the_target(tmp_path, stage, dtype):
    (tmp_path / "ds.py").write_text(SCRIPT)
    port = str(free_port())  # the suite's one port helper (conftest)
    res = run_cli("run", "deepspeed", "--num_gpus", "2", "--master_port", port, str(tmp_path / "ds.py"), "--stage", str(stage), "--dtype", dtype,
                  cwd=tmp_path, timeout=400)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    ranks = re.findall(rf"rank (\d)/2 on cuda:(\d) {dtype} zero {stage}: loss ([\d.]+) trained True backend gloo",
                       res.stdout)
    assert sorted((r, d) for r, d, _ in ranks) == [("0", "0"), ("1", "1")], res.stdout[-3000:]
    assert len({loss for _, _, loss in ranks}) == 1  # the same data-parallel model on both ranks
    assert (tmp_path / "ckpt" / "latest").exists()
