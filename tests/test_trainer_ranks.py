"""transformers' Trainer evaluating and predicting over 2 ranks (``accelerate launch --multi_gpu``).

Its evaluation loop gathers every rank's (B, C) logits and labels with accelerate's
``gather_for_metrics`` — ``all_gather_into_tensor`` into a flat output, as nccl takes it. On the gloo
group the adapter chose in nccl's place that crashed before redirect/distributed.py handed gloo the
output in its own layout ("ProcessGroupGloo::allgather: invalid tensor size at index 0"). Both ranks must
report the metrics over the whole evaluation set (18 samples, not 9) and agree on them; bf16 autocast,
gradient checkpointing and the fused AdamW ride along.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from conftest import free_port, run_cli

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = textwrap.dedent("""
    import numpy as np, torch
    from transformers import GPT2Config, GPT2ForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                                     num_labels=3, pad_token_id=0))

    class Data(torch.utils.data.Dataset):
        def __init__(self, n):
            g = torch.Generator().manual_seed(n)
            self.x, self.y = torch.randint(1, 100, (n, 12), generator=g), torch.randint(0, 3, (n,), generator=g)
        def __len__(self):
            return len(self.x)
        def __getitem__(self, i):
            return {"input_ids": self.x[i], "labels": self.y[i]}

    def metrics(p):
        return {"acc": float((np.argmax(p.predictions, -1) == p.label_ids).mean()), "n": len(p.label_ids)}

    args = TrainingArguments(output_dir="out", bf16=True, per_device_train_batch_size=4, per_device_eval_batch_size=5,
                             max_steps=2, eval_strategy="steps", eval_steps=2, report_to=[], save_strategy="no",
                             gradient_checkpointing=True, optim="adamw_torch_fused", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Data(32), eval_dataset=Data(18), compute_metrics=metrics)
    trainer.train()
    result = trainer.evaluate()
    predicted = trainer.predict(Data(7))
    print(f"rank {args.process_index} of {args.world_size}: eval n {result['eval_n']} acc {result['eval_acc']:.4f} "
          f"predictions {predicted.predictions.shape}", flush=True)
""")


FSDP = ["--use_fsdp", "--fsdp_sharding_strategy", "FULL_SHARD", "--fsdp_auto_wrap_policy", "NO_WRAP",
        "--fsdp_state_dict_type", "FULL_STATE_DICT"]


@pytest.mark.parametrize("mode", [["--multi_gpu"], FSDP], ids=["ddp", "fsdp"])
def test_trainer_gathers_metrics_over_two_ranks(tmp_path, mode):
    """``fsdp``: accelerate's FSDP plugin wraps the model in FSDP1 with ``device_id=accelerator.device``
    (cuda:<rank>) and ``sync_module_states=True``, which FSDP refused for parameters on the CPU ("requires
    them to be on GPU": nccl broadcasts device tensors only; gloo broadcasts the CPU's)."""
    (tmp_path / "trainer.py").write_text(SCRIPT)
    port = str(free_port())  # the suite's one port helper (conftest)
    res = run_cli("run", "accelerate", "launch", *mode, "--main_process_port", port, "--num_processes", "2",
                  "--num_machines", "1",
                  "--mixed_precision", "no", "--dynamo_backend", "no", str(tmp_path / "trainer.py"), cwd=tmp_path,
                  timeout=400)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    found = re.findall(r"rank (\d) of 2: eval n 18 acc ([\d.]+) predictions \(7, 3\)", res.stdout)
    assert sorted(r for r, _ in found) == ["0", "1"], res.stdout[-3000:]
    assert len({acc for _, acc in found}) == 1  # the same gathered predictions on both ranks
