"""examples/sd15_training: a CUDA-written SD v1.5 training script runs unchanged under the adapter.

The script runs in fresh interpreters exactly as a user types it (`python -m torch_adapter
run ...`, `torchrun ... -m torch_adapter run ...`); its helper modules are checked in
process. Sizes are cut (2 images a step, 16 samples) to keep this file well under 90 s.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, free_port, run_cli

EXAMPLE = ROOT / "examples" / "sd15_training"
SCRIPT = EXAMPLE / "train.py"
SMALL = ["--batch-size", "2", "--num-samples", "16"]
# One intra-op thread per process: on a shared 2-core box, 2 OpenMP threads contending with
# other work run these tiny steps many times slower (torchrun sets the same for its ranks).
ENV = {"OMP_NUM_THREADS": "1"}
DONE = re.compile(r"^done: (\d+) steps, final loss (\S+)$")


def _load(name: str):
    """An example helper module under a private name (`data`/`models` are too generic to import)."""
    spec = importlib.util.spec_from_file_location(f"sd15_example_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _final(stdout: str, steps: int) -> float:
    """The loss on the script's last line, which must say `done: <steps> steps, ...`."""
    lines = stdout.strip().splitlines()
    assert lines, "the script printed nothing"
    match = DONE.match(lines[-1])
    assert match, f"last line is not the summary: {lines[-1]!r}"
    assert int(match.group(1)) == steps
    loss = float(match.group(2))
    assert math.isfinite(loss) and loss > 0, loss
    return loss



def _show(res: subprocess.CompletedProcess) -> str:
    return f"exit {res.returncode}\n--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}"


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """2 steps with EMA and gradient checkpointing on, a checkpoint after each."""
    out = tmp_path_factory.mktemp("sd15")
    res = run_cli("run", str(SCRIPT), "--max-steps", "2", "--output-dir", str(out), "--checkpointing-steps", "1",
                  "--use-ema", "--gradient-checkpointing", *SMALL, env=ENV)
    return out, res


def test_two_steps_under_adapter(two_steps):
    out, res = two_steps
    assert res.returncode == 0, _show(res)
    assert "Traceback" not in res.stderr, _show(res)
    loss = _final(res.stdout, 2)
    assert "via torch_adapter x 1" in res.stdout  # torch.cuda.get_device_name answered by the adapter
    assert re.search(r"^step 2/2 loss \S+ .*step_time [\d.]+ ms .*max_mem \d+ MiB$", res.stdout, re.M), res.stdout

    state = torch.load(out / "checkpoint-2.pt", map_location="cpu", weights_only=True)
    assert state["step"] == 2 and state["loss"] == pytest.approx(loss, abs=1e-4)
    assert {"unet", "optimizer", "lr_scheduler", "scaler", "ema"} <= state.keys()
    assert state["ema"]["optimization_step"] == 2
    assert all(torch.isfinite(t).all() for t in state["unet"].values())
    assert (out / "checkpoint-1.pt").is_file()
    assert (out / "unet" / "config.json").is_file() and (out / "tokenizer" / "tokenizer.json").is_file()


def test_resume_for_one_more_step(two_steps, tmp_path):
    out, first = two_steps
    assert first.returncode == 0, _show(first)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(out / "checkpoint-2.pt", resumed / "checkpoint-2.pt")
    res = run_cli("run", str(SCRIPT), "--max-steps", "3", "--output-dir", str(resumed), "--resume", "latest",
                  "--use-ema", "--gradient-checkpointing", *SMALL, env=ENV)
    assert res.returncode == 0, _show(res)
    assert f"resumed from {resumed / 'checkpoint-2.pt'} at step 2" in res.stdout
    assert "step 1/" not in res.stdout and "step 3/3 loss" in res.stdout
    _final(res.stdout, 3)
    state = torch.load(resumed / "checkpoint-3.pt", map_location="cpu", weights_only=True)
    assert state["step"] == 3 and state["ema"]["optimization_step"] == 3
    # AdamW's moments carried over, not restarted. Its step counts the updates GradScaler let
    # through: float16 autocast (kept float16 on the CPU, as on CUDA) skips a step whose gradients
    # overflowed and halves its scale, so count from the checkpoint the run resumed from.
    # GradScaler can skip both first steps (their scaled gradients overflowed: which steps do depends on
    # how the CPU's kind computes float16); AdamW then has no state yet, and the scaler's carries it:
    # a restart would start again from 65536, a resume from the halved scale it saved.
    before = torch.load(out / "checkpoint-2.pt", map_location="cpu", weights_only=True)
    scale, saved = state["scaler"]["scale"], before["scaler"]["scale"]
    skipped = scale < saved
    assert scale in (saved, saved / 2), (scale, saved)
    had = before["optimizer"]["state"].get(0, {}).get("step")
    now = state["optimizer"]["state"].get(0, {}).get("step")
    if had is None:  # no update yet: the scale tells a resume (below 65536) from a restart
        assert saved < 65536.0, "no update and no skip in two steps: impossible"
        assert (now is None) == skipped and (now is None or now.item() == 1)
    else:
        assert now.item() == had.item() + (0 if skipped else 1)


def test_plain_python_without_gpu_says_so():
    """Unadapted on a CPU-only machine the script takes its own no-CUDA exit, before any work."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: plain python would train")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"} | ENV
    res = subprocess.run([sys.executable, str(SCRIPT), "--max-steps", "1"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 1
    assert "none is available" in res.stderr and "torch_adapter run" in res.stderr


def test_einsum_attention_matches_diffusers():
    from diffusers.models.attention_processor import Attention, AttnProcessor

    models = _load("models")
    torch.manual_seed(0)
    cross = Attention(query_dim=32, cross_attention_dim=16, heads=4, dim_head=8).eval()
    self_4d = Attention(query_dim=32, heads=2, dim_head=16, norm_num_groups=8, residual_connection=True,
                        upcast_attention=True, upcast_softmax=True).eval()
    hidden, context, image = torch.randn(2, 10, 32), torch.randn(2, 7, 16), torch.randn(2, 32, 4, 4)
    with torch.no_grad():
        for attn, args in ((cross, (hidden, context)), (self_4d, (image,))):
            attn.set_processor(AttnProcessor())
            expected = attn(*args)
            attn.set_processor(models.EinsumAttnProcessor())
            torch.testing.assert_close(attn(*args), expected, rtol=1e-5, atol=1e-5)


def test_full_config_is_sd15_size():
    models, data = _load("models"), _load("data")
    with torch.device("meta"):
        text_encoder, vae, unet = models.build_models(models.CONFIGS["full"], data.build_tokenizer(), 512)
    assert round(models.count_parameters(unet) / 1e6, 2) == 859.52
    assert round(models.count_parameters(vae) / 1e6, 2) == 83.65
    assert round(models.count_parameters(text_encoder) / 1e6, 2) == 123.06
    assert unet.config.sample_size == 64 and unet.config.cross_attention_dim == 768
    scheduler = models.build_noise_scheduler()
    assert scheduler.config.beta_schedule == "scaled_linear" and scheduler.config.num_train_timesteps == 1000
    assert scheduler.betas[0].item() == pytest.approx(0.00085) and scheduler.betas[-1].item() == pytest.approx(0.012)


def test_captions_describe_the_images():
    data = _load("data")
    tokenizer = data.build_tokenizer()
    for seed in range(20):
        image, caption = data.render_sample(random.Random(seed), 64)
        words = caption.split()
        assert len(words) == 8 and words[0] == "a" and words[4:6] == ["on", "a"], caption
        size, colour, shape, background = words[1], words[2], words[3], words[6]
        assert size in data.SIZES and shape in data.SHAPES and words[7] == "background", caption
        colours = {image.getpixel((x, y)) for x in range(64) for y in range(64)}
        assert colours == {data.COLOURS[colour], data.COLOURS[background]}, caption
        ids = data.tokenize_captions(tokenizer, [caption])[0]
        assert ids.shape == (77,) and tokenizer.unk_token_id not in ids.tolist()
        assert tokenizer.decode(ids, skip_special_tokens=True) == caption


@pytest.mark.slow
def test_torchrun_two_processes(tmp_path):
    torchrun = shutil.which("torchrun")
    launcher = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    cmd = [*launcher, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "torch_adapter", "run",
           str(SCRIPT), "--max-steps", "2", "--output-dir", str(tmp_path), *SMALL]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"} | ENV
    env["PYTHONUNBUFFERED"] = "1"

    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, _show(res)
    assert "via torch_adapter x 2" in res.stdout, res.stdout
    assert res.stdout.count("done: ") == 1  # rank 0 logs
    _final(res.stdout, 2)
    state = torch.load(tmp_path / "checkpoint-2.pt", map_location="cpu", weights_only=True)
    assert state["step"] == 2
