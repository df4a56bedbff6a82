"""Real-program acceptance run: public CUDA-written programs, unchanged, under torch_adapter.

    python benchmarks/realworld/run.py CHECKOUT [CHECKOUT ...] [--torchvision DIR] [--only SUBSTR]
                                       [--work DIR] [--json PATH] [--timeout S]

Each CHECKOUT is a local git checkout of a public project (recognised by its files:
diffusers, pytorch/examples, nanoGPT, minGPT, pytorch-image-models, DiT,
denoising-diffusion-pytorch). Every case runs the
project's own entry point with ``python -m torch_adapter run`` (or under ``accelerate
launch`` / ``torchrun``), on tiny local data and tiny models built from configs
(fixtures.py; HF_HUB_OFFLINE=1), and prints one ``ok``/``FAIL`` line; the run ends with
``N passed, M failed`` and writes JSON (default benchmarks/results/realworld.json).
See README.md here for requirements (torchvision shim, datasets) and the case list.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cases_machinery  # noqa: E402
import fixtures  # noqa: E402
from common import PY, ROOT, RUN, TORCHRUN2, Case, set_target_flags, with_target_flags  # noqa: E402,F401
from common import floats, keyed, texts  # noqa: E402
from common import expect as _expect, free_port as _free_port, slug as _slug  # noqa: E402

ACCEL1 = ["accelerate", "launch", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
          "--dynamo_backend", "no"]

REPOS = {  # key -> a file that identifies the checkout
    "diffusers": "examples/text_to_image/train_text_to_image.py",
    "examples": "imagenet/main.py",
    "nanoGPT": "config/train_shakespeare_char.py",
    "minGPT": "projects/adder/adder.py",
    "timm": "timm/version.py",
    "DiT": "diffusion/respace.py",
    "ddpm": "denoising_diffusion_pytorch/denoising_diffusion_pytorch.py",
    **cases_machinery.REPOS,
}


# -- diffusers: examples/text_to_image/train_text_to_image.py -------------------------------------------------------
T2I = "examples/text_to_image/train_text_to_image.py"


def _t2i_args(work: Path, *extra: str) -> list[str]:
    sd = fixtures.tiny_sd(work.parent / "_tiny_sd")
    data = fixtures.caption_folder(work.parent / "_captions")
    return ["--pretrained_model_name_or_path", str(sd), "--train_data_dir", str(data), "--caption_column", "text",
            "--resolution", "16", "--train_batch_size", "2", "--max_train_steps", "2", "--learning_rate", "1e-4",
            "--output_dir", str(work / "out"), "--seed", "0", "--dataloader_num_workers", "0",
            "--checkpointing_steps", "1", "--report_to", "all", *extra]


def _t2i_check(work: Path, out: str) -> str | None:
    outdir = work / "out"
    for need in ("model_index.json", "unet", "checkpoint-1", "checkpoint-2"):
        if not (outdir / need).exists():
            return f"missing {outdir / need}"
    res = subprocess.run([*RUN, str(HERE / "reload_sd.py"), str(outdir)], capture_output=True, text=True,
                         env=_env(False, None), timeout=600)
    if res.returncode != 0 or "reloaded ok" not in res.stdout:
        return "saved pipeline does not reload: " + _reason(res.stderr)
    return None


def _t2i(name: str, launch: list[str], *extra: str) -> Case:
    def build(repo: Path, work: Path) -> tuple[list[str], Path]:
        script = str(repo / T2I)
        args = _t2i_args(work, *extra)
        if launch and launch[0] == "torchrun":  # the documented form: torchrun … -m torch_adapter run SCRIPT
            return [*launch, "-m", "torch_adapter", "run", script, *args], work
        return [*RUN, *launch, script, *args], work
    return Case(name, "diffusers", build, _t2i_check, timeout=1200)


# -- diffusers: examples/dreambooth/train_dreambooth_lora.py --------------------------------------------------------
DREAMBOOTH = "examples/dreambooth/train_dreambooth_lora.py"
CLASS_IMAGES = 4


def _dreambooth(repo: Path, work: Path):
    """Prior preservation: the script first generates the class images with a float16 pipeline (the
    inference phase issue 22 measured), then trains LoRA layers under fp16 AMP and validates."""
    sd = fixtures.tiny_sd(work.parent / "_tiny_sd")
    instance = fixtures.caption_folder(work / "instance", n=4, size=32)
    (instance / "metadata.jsonl").unlink()  # DreamBooth reads a plain folder of images
    return [*RUN, str(repo / DREAMBOOTH), "--pretrained_model_name_or_path", str(sd), "--instance_data_dir",
            str(instance), "--instance_prompt", "a photo of sks dog", "--with_prior_preservation",
            "--class_data_dir", str(work / "class"), "--class_prompt", "a photo of dog", "--num_class_images",
            str(CLASS_IMAGES), "--sample_batch_size", "2", "--prior_generation_precision", "fp16",
            "--resolution", "32", "--train_batch_size", "1", "--max_train_steps", "2", "--checkpointing_steps", "1",
            "--mixed_precision", "fp16", "--rank", "4", "--validation_prompt", "a sks dog", "--validation_epochs",
            "1", "--num_validation_images", "1", "--output_dir", str(work / "out"), "--seed", "0",
            "--report_to", "all"], work


def _dreambooth_check(work: Path, out: str) -> str | None:
    made = sorted((work / "class").glob("*.jpg"))
    if len(made) != CLASS_IMAGES:
        return f"{len(made)} class images generated, expected {CLASS_IMAGES}"
    for need in ("pytorch_lora_weights.safetensors", "checkpoint-1", "checkpoint-2"):
        if not (work / "out" / need).exists():
            return f"missing {work / 'out' / need}"
    res = subprocess.run([*RUN, str(HERE / "reload_lora.py"), str(work.parent / "_tiny_sd"), str(work / "out")],
                         capture_output=True, text=True, env=_env(False, None), timeout=600)
    if res.returncode != 0 or "lora reloaded ok" not in res.stdout:
        return "saved LoRA weights do not reload: " + _reason(res.stderr)
    return None


# -- diffusers: examples/controlnet/train_controlnet.py -----------------------------------------------------------------
CONTROLNET = "examples/controlnet/train_controlnet.py"


def _controlnet(repo: Path, work: Path):
    """ControlNet from the UNet's weights, fp16 AMP, validation at every step (a float16 pipeline in the loop)."""
    sd = fixtures.tiny_sd(work.parent / "_tiny_sd_vae8", vae_factor=8)  # its conditioning embedding assumes 8
    data = fixtures.controlnet_folder(work.parent / "_controlnet_data")
    return [*RUN, str(repo / CONTROLNET), "--pretrained_model_name_or_path", str(sd), "--train_data_dir", str(data),
            "--resolution", "64", "--train_batch_size", "1", "--max_train_steps", "2", "--checkpointing_steps", "1",
            "--mixed_precision", "fp16", "--validation_prompt", "red circle", "--validation_image",
            str(data / "cond_0.png"), "--validation_steps", "1", "--num_validation_images", "1",
            "--output_dir", str(work / "out"), "--seed", "0", "--report_to", "all"], work


def _controlnet_check(work: Path, out: str) -> str | None:
    runs = out.count("Running validation")
    if runs < 3:  # after steps 1 and 2, and the final one
        return f"validation ran {runs} times, expected 3"
    for need in ("diffusion_pytorch_model.safetensors", "checkpoint-1", "checkpoint-2"):
        if not (work / "out" / need).exists():
            return f"missing {work / 'out' / need}"
    res = subprocess.run([*RUN, str(HERE / "reload_controlnet.py"), str(work.parent / "_tiny_sd_vae8"),
                          str(work / "out"), str(work.parent / "_controlnet_data" / "cond_0.png")],
                         capture_output=True, text=True, env=_env(False, None), timeout=600)
    if res.returncode != 0 or "controlnet reloaded ok" not in res.stdout:
        return "saved ControlNet does not drive the pipeline: " + _reason(res.stderr)
    return None


# -- pytorch/examples ------------------------------------------------------------------------------------------------
def _mnist(repo: Path, work: Path):
    fixtures.mnist_raw(work.parent / "data")  # main.py reads ../data
    return [*RUN, str(repo / "mnist/main.py"), "--epochs", "1", "--batch-size", "16", "--test-batch-size", "16",
            "--log-interval", "1", "--save-model"], work


def _imagenet(mode: str):
    def build(repo: Path, work: Path):
        data = fixtures.image_folder(work.parent / "_imagenet", size=40)
        args = [str(data), "-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "2", "-p", "1",
                "--seed", "0"]  # seeded: the targets' losses are compared
        script = str(repo / "imagenet/main.py")
        if mode == "dp":  # the script's default path: nn.DataParallel(model).cuda()
            return [*RUN, script, *args], work
        if mode == "mpdist":  # its DDP path: mp.spawn one process per device, nccl
            port = _free_port()
            return [*RUN, script, *args, "--dist-url", f"tcp://127.0.0.1:{port}", "--dist-backend", "nccl",
                    "--multiprocessing-distributed", "--world-size", "1", "--rank", "0"], work
        return [*TORCHRUN2, "-m", "torch_adapter", "run", script, *args, "--dist-url", "env://",
                "--dist-backend", "nccl"], work  # torchrun 2 ranks, DataLoader workers (the exit-hang case)
    return build


def _dcgan(repo: Path, work: Path):
    return [*RUN, str(repo / "dcgan/main.py"), "--dataset", "fake", "--accel", "--dry-run", "--batchSize", "8",
            "--imageSize", "64", "--ngf", "8", "--ndf", "8", "--nz", "16", "--workers", "0", "--niter", "1",
            "--outf", str(work / "out"), "--manualSeed", "1"], work


def _wlm(model: str):
    def build(repo: Path, work: Path):
        data = fixtures.text_corpus(work.parent / "_text")
        return [*RUN, str(repo / "word_language_model/main.py"), "--data", str(data), "--model", model, "--accel",
                "--epochs", "1", "--emsize", "16", "--nhid", "16", "--nlayers", "1", "--bptt", "8", "--batch_size",
                "4", "--log-interval", "2", "--save", str(work / "model.pt")], work
    return build


def _ddp_tutorial(repo: Path, work: Path):
    script = str(repo / "distributed/ddp-tutorial-series/multigpu_torchrun.py")
    return [*RUN, *TORCHRUN2, script, "2", "1", "--batch_size", "64"], work  # launcher mode: torch-adapter run torchrun


def _mnist_example(path: str, *args: str):
    def build(repo: Path, work: Path):
        fixtures.mnist_raw(work.parent / "data")  # the MNIST examples read ../data
        (work / "results").mkdir(exist_ok=True)  # vae/main.py saves images to results/
        return [*RUN, str(repo / path), *args], work
    return build


def _mnist_ff(repo: Path, work: Path):
    fixtures.mnist_raw(work / "data")  # mnist_forward_forward reads ./data
    return [*RUN, str(repo / "mnist_forward_forward/main.py"), "--epochs", "3", "--train_size", "64",
            "--test_size", "32", "--log-interval", "1", "--save_model"], work


def _torchrun_example(path: str, *args: str, ranks: int = 2):
    def build(repo: Path, work: Path):
        launch = ["torchrun", "--standalone", "--nproc-per-node", str(ranks)]
        return [*launch, "-m", "torch_adapter", "run", str(repo / path), *args], work
    return build


# -- denoising-diffusion-pytorch: the README's Trainer usage, written as a file (library usage) ------------------
def _ddpm(repo: Path, work: Path):
    data = fixtures.image_folder(work.parent / "_ddpm_images", classes=1, per_class=100, size=16, splits=("train",))
    return [*RUN, str(HERE / "ddpm_readme.py"), str(data)], work


# -- nanoGPT ---------------------------------------------------------------------------------------------------------
def _nanogpt(ranks: int):
    def build(repo: Path, work: Path):
        fixtures.nanogpt_chars(work / "data" / "shakespeare_char")  # train.py reads data/<dataset> from cwd
        link = work / "configurator.py"  # … and exec()s ./configurator.py: a link to the checkout's, not a copy
        if not link.exists():
            link.symlink_to(repo / "configurator.py")
        args = [str(repo / "config/train_shakespeare_char.py"), "--device=cuda", "--compile=False", "--dtype=float16",
                "--max_iters=4", "--lr_decay_iters=4", "--eval_interval=2", "--eval_iters=2", "--log_interval=1",
                "--batch_size=4", "--block_size=32", "--n_layer=2", "--n_head=2", "--n_embd=32",
                f"--gradient_accumulation_steps={2 * ranks}", "--always_save_checkpoint=True", "--out_dir=out"]
        script = str(repo / "train.py")
        if ranks == 1:
            return [*RUN, script, *args], work
        return [*TORCHRUN2, "-m", "torch_adapter", "run", script, *args], work
    return build


NANOGPT_TRAIN1 = "nanoGPT train.py float16 AMP + GradScaler"


def _nanogpt_sample(repo: Path, work: Path):
    train = work.parent / _slug(NANOGPT_TRAIN1)
    if not (train / "out" / "ckpt.pt").exists():
        raise RuntimeError(f"needs the checkpoint of the case {NANOGPT_TRAIN1!r} (run it first, same --work)")
    for name, target in (("configurator.py", repo / "configurator.py"), ("data", train / "data")):
        if not (work / name).exists():  # sample.py exec()s ./configurator.py and reads data/<dataset>/meta.pkl
            (work / name).symlink_to(target)
    return [*RUN, str(repo / "sample.py"), "--init_from=resume", f"--out_dir={train / 'out'}", "--device=cuda",
            "--num_samples=2", "--max_new_tokens=24"], work  # dtype: its default (bfloat16 if is_bf16_supported)


def _nanogpt_check(work: Path, out: str) -> str | None:
    return None if (work / "out" / "ckpt.pt").exists() else "no out/ckpt.pt"


# -- minGPT ----------------------------------------------------------------------------------------------------------
def _mingpt(repo: Path, work: Path):
    return [*RUN, str(repo / "projects/adder/adder.py"), "--trainer.max_iters=30", "--trainer.batch_size=32",
            "--trainer.num_workers=0", f"--system.work_dir='{work / 'out'}'"], work  # values are literal_eval()ed


# -- timm ------------------------------------------------------------------------------------------------------------
def _timm(amp: bool, ranks: int = 1):
    def build(repo: Path, work: Path):
        data = fixtures.image_folder(work.parent / "_imagenet", size=40)
        args = ["--data-dir", str(data), "--val-split", "val", "--model", "resnet18", "--num-classes", "2",
                "--img-size", "32", "-b", "4", "--epochs", "1", "--warmup-epochs", "0", "--sched", "step",
                "--workers", "1", "--log-interval", "1", "--output", str(work / "out"), "--experiment", "e",
                "--checkpoint-hist", "1", *(["--amp"] if amp else [])]
        script = str(repo / "train.py")
        if ranks == 1:
            return [*RUN, script, *args], work
        return [*TORCHRUN2, "-m", "torch_adapter", "run", script, *args], work
    return build


# -- facebookresearch/DiT -------------------------------------------------------------------------------------------
DIT_VAES = ("stabilityai/sd-vae-ft-ema", "stabilityai/sd-vae-ft-mse")  # train.py's default --vae, sample.py's
DIT_TRAIN1 = "DiT train.py torchrun 1 rank (asserts CUDA, nccl, from_pretrained VAE)"


def _dit_train(ranks: int):
    def build(repo: Path, work: Path):
        fixtures.hf_cached_vae(work / "hf_home", DIT_VAES)
        data = fixtures.image_folder(work.parent / "_dit_images", splits=("train",)) / "train"
        args = ["--data-path", str(data), "--results-dir", str(work / "results"), "--model", "DiT-S/8",
                "--image-size", "256", "--epochs", "1", "--global-batch-size", str(2 * ranks),
                "--num-workers", str(ranks - 1), "--log-every", "1", "--ckpt-every", str(8 // (2 * ranks))]
        launch = ["torchrun", "--standalone", "--nproc-per-node", str(ranks)]
        return [*launch, "-m", "torch_adapter", "run", str(repo / "train.py"), *args], work
    return build


def _dit_ckpt(work: Path) -> Path | None:
    found = sorted((work / "results").glob("*/checkpoints/*.pt"))
    return found[-1] if found else None


def _dit_check(work: Path, out: str) -> str | None:
    if _dit_ckpt(work) is None:
        return "no results/*/checkpoints/*.pt"
    return None if "Done!" in out else "output lacks Done!"


def _dit_sample(repo: Path, work: Path):
    fixtures.hf_cached_vae(work / "hf_home", DIT_VAES)
    # Comparing targets, both sample from the reference's checkpoint: the case checks the sampling path (CFG, the
    # device's randn, the VAE decode), not the train case again (its checkpoints differ in their last bits between
    # targets: the device's optimizer takes torch's foreach kernels, the host's the per-parameter loop)
    ckpt = _dit_ckpt(work.parent.parent / _label(CPU_REFERENCE) / _slug(DIT_TRAIN1)) \
        or _dit_ckpt(work.parent / _slug(DIT_TRAIN1))
    if ckpt is None:
        raise RuntimeError(f"needs the checkpoint of the case {DIT_TRAIN1!r} (run it first, same --work)")
    return [*RUN, str(repo / "sample.py"), "--model", "DiT-S/8", "--image-size", "256", "--num-sampling-steps", "2",
            "--ckpt", str(ckpt)], work




CASES = [
    _t2i("diffusers t2i: run, fp32, checkpoints, saved + reloaded", [], "--mixed_precision", "no"),
    _t2i("diffusers t2i: run --mixed_precision fp16 --gradient_checkpointing --use_ema", [],
         "--mixed_precision", "fp16", "--gradient_checkpointing", "--use_ema"),
    _t2i("diffusers t2i: torch-adapter run accelerate launch", ACCEL1, "--mixed_precision", "no"),
    _t2i("diffusers t2i: torchrun 2 ranks", TORCHRUN2, "--mixed_precision", "no"),
    Case("diffusers dreambooth LoRA: float16 class images, fp16 AMP, validation, LoRA reloaded", "diffusers",
         _dreambooth, _dreambooth_check, timeout=1200),
    Case("diffusers controlnet: fp16 AMP, validation every step, saved ControlNet drives the pipeline", "diffusers",
         _controlnet, _controlnet_check, timeout=1200),
    Case("pytorch/examples mnist (torch.accelerator)", "examples", _mnist, _expect(r"Test set: Average loss",
                                                                                   "mnist_cnn.pt")),
    Case("pytorch/examples imagenet resnet18: DataParallel (default path)", "examples", _imagenet("dp"),
         _expect(r"Acc@1")),
    Case("pytorch/examples imagenet resnet18: --multiprocessing-distributed (mp.spawn, nccl)", "examples",
         _imagenet("mpdist"), _expect(r"Acc@1")),
    Case("pytorch/examples imagenet resnet18: torchrun 2 ranks, DataLoader workers", "examples",
         _imagenet("torchrun"), _expect(r"Acc@1")),
    Case("pytorch/examples dcgan --dataset fake --accel", "examples", _dcgan, _expect(r"Loss_D")),
    Case("pytorch/examples word_language_model LSTM --accel", "examples", _wlm("LSTM"), _expect(r"End of training")),
    Case("pytorch/examples word_language_model Transformer --accel", "examples", _wlm("Transformer"),
         _expect(r"End of training")),
    Case("pytorch/examples ddp-tutorial multigpu_torchrun: torch-adapter run torchrun 2 ranks", "examples",
         _ddp_tutorial, _expect(r"Training snapshot saved")),
    Case("pytorch/examples mnist_hogwild --cuda (mp.Process children share a CUDA model)", "examples",
         _mnist_example("mnist_hogwild/main.py", "--cuda", "--num-processes", "2", "--epochs", "1", "--batch-size",
                        "16", "--test-batch-size", "16", "--log-interval", "1", "--dry-run"),
         _expect(r"Test set: Average loss")),
    Case("pytorch/examples vae/main.py (torch.accelerator)", "examples",
         _mnist_example("vae/main.py", "--epochs", "1", "--batch-size", "16", "--log-interval", "1"),
         _expect(r"(?s)Using device: (?:cuda|npu).*Test set loss", "results/sample_1.png")),
    Case("pytorch/examples mnist_rnn --accel (LSTM)", "examples",
         _mnist_example("mnist_rnn/main.py", "--accel", "--epochs", "1", "--batch-size", "16", "--test-batch-size",
                        "16", "--log-interval", "1", "--dry-run"), _expect(r"Test set: Average loss")),
    Case("pytorch/examples siamese_network (torch.accelerator)", "examples",
         _mnist_example("siamese_network/main.py", "--epochs", "1", "--batch-size", "16", "--test-batch-size", "16",
                        "--log-interval", "1", "--dry-run"), _expect(r"(?s)Using device: (?:cuda|npu).*Test set: Average loss")),
    Case("pytorch/examples mnist_forward_forward (torch.accelerator; pinned batches from a DataLoader worker)",
         "examples", _mnist_ff, _expect(r"(?s)train error: [\d.]+.*test error: [\d.]+", "mnist_ff.pt")),
    Case("pytorch/examples distributed/FSDP2 example.py: torchrun 2 ranks (fully_shard, meta init, DCP save)",
         "examples", _torchrun_example("distributed/FSDP2/example.py"), _expect(r"Running on rank 1", "checkpoints")),
    Case("pytorch/examples distributed/FSDP2 example.py --mixed-precision --explicit-prefetching", "examples",
         _torchrun_example("distributed/FSDP2/example.py", "--mixed-precision", "--explicit-prefetching"),
         _expect(r"Running on rank 1", "checkpoints")),
    Case("pytorch/examples tensor_parallelism tensor_parallel_example.py: torchrun 2 ranks (DTensor)", "examples",
         _torchrun_example("distributed/tensor_parallelism/tensor_parallel_example.py"),
         _expect(r"Tensor Parallel training completed")),
    Case("pytorch/examples tensor_parallelism sequence_parallel_example.py: torchrun 2 ranks", "examples",
         _torchrun_example("distributed/tensor_parallelism/sequence_parallel_example.py"),
         _expect(r"Sequence Parallel training completed")),
    Case("pytorch/examples tensor_parallelism fsdp_tp_example.py: torchrun 4 ranks (2-D mesh FSDP + TP, Llama2)",
         "examples", _torchrun_example("distributed/tensor_parallelism/fsdp_tp_example.py", ranks=4),
         _expect(r"2D training successfully completed")),
    Case(NANOGPT_TRAIN1, "nanoGPT", _nanogpt(1), _nanogpt_check),
    Case("nanoGPT train.py torchrun 2 ranks (DDP, nccl)", "nanoGPT", _nanogpt(2), _nanogpt_check),
    Case("nanoGPT sample.py --init_from=resume (generation under autocast, default dtype)", "nanoGPT",
         _nanogpt_sample, _expect(r"(?s)---------------.*---------------")),
    Case("denoising-diffusion-pytorch README Trainer usage (accelerate fp16, flash_attn=True)", "ddpm", _ddpm,
         _expect(r"training complete", "results/model-1.pt"), extra_path=True),
    Case("minGPT projects/adder", "minGPT", _mingpt, _expect(r"iter_dt .* iter 20"), extra_path=True),
    Case("timm train.py resnet18 --amp", "timm", _timm(True), _expect(r"Train: 0 .*100%", "out/e"),
         extra_path=True),
    Case("timm train.py resnet18 torchrun 2 ranks", "timm", _timm(False, 2), _expect(r"Train: 0"), extra_path=True),
    Case(DIT_TRAIN1, "DiT", _dit_train(1), _dit_check, with_repos=("timm",),
         env={"HF_HOME": "{work}/hf_home"}),
    Case("DiT train.py torchrun 2 ranks (DDP, DataLoader worker, pin_memory)", "DiT", _dit_train(2), _dit_check,
         with_repos=("timm",), env={"HF_HOME": "{work}/hf_home"}),
    Case("DiT sample.py from the train case's checkpoint (inference, CFG)", "DiT", _dit_sample,
         _expect(r"100%", "sample.png"), with_repos=("timm",),
         env={"HF_HOME": "{work}/hf_home", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}),  # its checkpoint holds args
    *cases_machinery.CASES,  # torch's machinery: TorchScript, torch.compile, CUDA graphs, custom ops
]



# -- what each case's two runs are compared by: the losses (or the metric) it prints, and what it writes ---------------
_T2I = dict(metric=keyed(r"(?P<step>\d+)/2 \[[^\]\n]*step_loss=(?P<value>[-\d.e+]+)"),
            note="step_loss per step (tqdm, 3 digits)", artifacts=("out/unet/*.safetensors",))
def _nanogpt_samples(work: Path, out: str) -> list:
    """sample.py's samples: what it prints after its set-up lines, each ended by a line of dashes."""
    start = out.find("\n", out.find("Loading meta from")) + 1 if "Loading meta from" in out else 0
    chunks = out[start:].split("\n---------------\n")
    return [c.strip("\n") for c in chunks[:-1]]


_LOSS_TEST = floats(r"(?:\tLoss|Average loss): ([\d.]+)")
_COMPARE = {
    "diffusers t2i": _T2I,
    "diffusers dreambooth": dict(metric=keyed(r"(?P<step>\d+)/2 \[[^\]\n]*\bloss=(?P<value>[-\d.e+]+)"),
                                 note="loss per step (tqdm, 3 digits)", artifacts=("out/*.safetensors",)),
    "diffusers controlnet": dict(metric=keyed(r"(?P<step>\d+)/2 \[[^\]\n]*\bloss=(?P<value>[-\d.e+]+)"),
                                 note="loss per step (tqdm, 3 digits)", artifacts=("out/*.safetensors",)),
    "pytorch/examples mnist (": dict(metric=_LOSS_TEST, note="train losses, test loss", artifacts=("mnist_cnn.pt",)),
    "imagenet resnet18: DataParallel": dict(metric=floats(r"Loss ([\d.]+e[-+]\d+) \("),
                                           note="Loss per batch, train and validation"),
    "imagenet resnet18: --multiprocessing": dict(
        metric=floats(r"Loss ([\d.]+e[-+]\d+) \(", ranks=True), deterministic=False,
        note="Loss per batch; not comparable: --seed seeds the parent only, the mp.spawn children are unseeded"),
    "imagenet resnet18: torchrun": dict(metric=floats(r"Loss ([\d.]+e[-+]\d+) \(", ranks=True),
                                        note="Loss per batch, both ranks (sorted)"),
    "dcgan": dict(metric=floats(r"Loss_D: ([\d.]+) Loss_G: ([\d.]+)"), note="Loss_D, Loss_G per batch"),
    "word_language_model": dict(metric=floats(r"\bloss\s+([\d.]+)"), note="train, valid and test loss (2 decimals)"),
    "ddp-tutorial": dict(note="prints no loss (an unseeded random data set)"),
    "mnist_hogwild": dict(metric=_LOSS_TEST, deterministic=False,
                          note="losses; not comparable: two processes update one shared model (Hogwild)"),
    "vae/main.py": dict(metric=floats(r"(?:\tLoss|Average loss|Test set loss): ([\d.]+)"),
                        note="train losses, epoch and test loss", artifacts=("results/*.png",)),
    "mnist_rnn": dict(metric=_LOSS_TEST, note="train losses, test loss"),
    "siamese_network": dict(metric=_LOSS_TEST, note="train losses, test loss"),
    "mnist_forward_forward": dict(metric=floats(r"Loss:  ([\d.]+)"), deterministic=False,
                                  note="losses per step; not comparable: --seed is parsed but never used (the negative "
                                       "labels are drawn with the unseeded global generator)"),
    "FSDP2": dict(note="prints no loss; what it saves is not comparable: after to_empty() the example's "
                       "Transformer.reset_parameters() initialises the embeddings, final norm and output only, so the "
                       "layers train from uninitialised memory (NaN on both targets)",
                  artifacts=("checkpoints/*/*/*.pt",), deterministic=False),
    "tensor_parallel_example": dict(note="prints no loss"),
    "sequence_parallel_example": dict(note="prints no loss"),
    "fsdp_tp_example": dict(note="prints no loss"),
    NANOGPT_TRAIN1: dict(metric=floats(r"iter \d+: loss ([\d.]+)|train loss ([\d.]+), val loss ([\d.]+)"),
                         note="loss per iter, train/val loss per eval", artifacts=("out/ckpt.pt",)),
    "nanoGPT train.py torchrun": dict(metric=floats(r"iter \d+: loss ([\d.]+)|train loss ([\d.]+), val loss ([\d.]+)"),
                                      note="loss per iter, train/val loss per eval (rank 0)",
                                      artifacts=("out/ckpt.pt",)),
    "nanoGPT sample.py": dict(metric=_nanogpt_samples, note="the generated samples (text)"),
    "denoising-diffusion-pytorch": dict(
        metric=keyed(r"loss: (?P<value>[\d.]+):\s+\d+%\|[^|\n]*\|\s*(?P<step>\d+)/2"),
        note="loss per step (tqdm, 4 decimals)", artifacts=("results/model-1.pt", "results/*.png")),
    "minGPT": dict(metric=floats(r"iter \d+: train loss ([\d.]+)|final score: (\d+)/"),
                   note="train loss every 10 iters, final scores"),
    "timm train.py resnet18 --amp": dict(metric=floats(r"Loss:\s+([\d.]+)"), note="Loss per batch, train and eval",
                                         artifacts=("out/e/last.pth.tar",)),
    "timm train.py resnet18 torchrun": dict(metric=floats(r"Loss:\s+([\d.]+)"), note="Loss per batch (rank 0)",
                                            artifacts=("out/e/last.pth.tar",)),
    "DiT train.py torchrun 1": dict(metric=floats(r"Train Loss: ([\d.]+)"), note="Train Loss per log step",
                                    artifacts=("results/*/checkpoints/*.pt",)),
    "DiT train.py torchrun 2": dict(metric=floats(r"Train Loss: ([\d.]+)"), note="Train Loss per log step",
                                    artifacts=("results/*/checkpoints/*.pt",)),
    "DiT sample.py": dict(note="prints no loss: the sampled image is compared", artifacts=("sample.png",)),
    **cases_machinery.COMPARE,
}


def _apply_compare(cases: list[Case]) -> None:
    for case in cases:
        for key, spec in _COMPARE.items():
            if key in case.name:
                case.compares(spec.get("metric"), spec.get("note", ""), spec.get("artifacts", ()),
                              spec.get("deterministic", True))
                break


_apply_compare(CASES)

_TV: list[str] = []


def _env(extra_path: bool, repo: Path | None, base: Path | None = None) -> dict:
    paths = [str(HERE / "tv_shim"), *_TV, str(ROOT / "adapter"), str(ROOT / "widgets")]
    if extra_path and repo is not None:
        paths.insert(0, str(repo))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           "TORCH_ADAPTER_EXIT_TIMEOUT": "60", "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}  # no __pycache__ written into the checkouts
    if base is not None:
        env["HF_HOME"] = str(base / "_hf_home")  # no user accelerate config, no cache sharing
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    return env


def _reason(text: str) -> str:
    """The most telling line of a failure: the last exception line, else the last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b|^torch_adapter: .*(not|no) ", ln):
            return ln[:300]
    return (lines[-1] if lines else "no output")[:300]




def detect(path: Path) -> str | None:
    for key, marker in REPOS.items():
        if (path / marker).is_file():
            return key
    return None


# -- targets: each pass runs every case under `torch_adapter run` with its flags ---------------------------------------
# The reference pass: the CPU target computing float16 as the program asks (by default this CPU target computes
# float16 matmuls in its fast dtype and stores float16 requests as float32: a deliberate change of numerics that
# an accelerator target does not make), so that a float16 case's losses can be compared with the device's.
CPU_REFERENCE = ["--target", "cpu", "--float16-compute", "float16", "--dtype-policy", "float16"]


def _target_flags(target: str | None, emulate: bool) -> list[str]:
    return [] if target is None else ["--target", target, *(["--emulate"] if emulate else [])]


def _label(flags: list[str]) -> str:
    """A pass's folder name and JSON key: cpu, npu-emulated, …, or auto (no flags)."""
    if not flags:
        return "auto"
    target = flags[flags.index("--target") + 1]
    return target + ("-emulated" if "--emulate" in flags else "")


def _report_flags(cdir: Path) -> list[str]:
    # {rank}: each torchrun rank writes its own; launchers (form B) and mp.spawn children merge into one
    return ["--report-json", str(cdir / "report-{rank}.json")]


def _routing(cdir: Path) -> dict | None:
    """What the reports of a case's processes say: ops that reached the device's fallback (calls, bytes each
    way), summed over the processes, and the redirect count."""
    files = sorted(cdir.glob("report-*.json"))
    if not files:
        return None
    fallbacks: dict[str, dict] = {}
    summary: dict[str, int] = {}
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for rec in [data, *data.get("children", [])] if isinstance(data, dict) else []:
            for k, v in (rec.get("summary") or {}).items():
                if isinstance(v, int):
                    summary[k] = summary.get(k, 0) + v
            for op in rec.get("ops", []):
                if op.get("route") != "fallback":
                    continue
                row = fallbacks.setdefault(op["op"], {"calls": 0, "bytes_to_cpu": 0, "bytes_from_cpu": 0})
                row["calls"] += int(op.get("calls") or 0)
                row["bytes_to_cpu"] += int(op.get("bytes_to_cpu") or 0)
                row["bytes_from_cpu"] += int(op.get("bytes_from_cpu") or 0)
    top = sorted(fallbacks.items(), key=lambda kv: -(kv[1]["bytes_to_cpu"] + kv[1]["bytes_from_cpu"]))
    copied = [op for op, r in fallbacks.items() if r["bytes_to_cpu"] or r["bytes_from_cpu"]]
    return {"processes": len(files), "summary": summary, "fallback_ops": len(fallbacks),
            "fallback_calls": sum(r["calls"] for r in fallbacks.values()),
            "ops_that_copied": len(copied),  # the rest: routed as fallback, no copy measured by the device
            "bytes_to_cpu": sum(r["bytes_to_cpu"] for r in fallbacks.values()),
            "bytes_from_cpu": sum(r["bytes_from_cpu"] for r in fallbacks.values()),
            "fallbacks": dict(top)}


def _tensor_digest(path: Path) -> str:
    """A digest of the tensors in a torch.save file (not its bytes: they name the device the tensors were on)."""
    import hashlib

    import torch

    h = hashlib.sha256()

    def walk(obj, key=""):
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous().reshape(-1)
            h.update(f"{key}:{t.dtype}:{tuple(obj.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                walk(obj[k], f"{key}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{key}[{i}]")
    walk(torch.load(path, map_location="cpu", weights_only=False))
    return h.hexdigest()[:16]


def _artifacts(case: Case, cdir: Path) -> dict[str, str]:
    """Digests of what the case wrote (its artifacts' globs): file bytes, or tensors for .pt/.pth files."""
    import hashlib

    out: dict[str, str] = {}
    for path in sorted({p for g in case.artifacts for p in cdir.glob(g) if p.is_file()}):
        try:
            if path.name.endswith((".pt", ".pth", ".pth.tar")):
                digest = _tensor_digest(path)
            elif path.suffix in (".png", ".jpg"):  # the pixels (the encoder's bytes vary between runs)
                import numpy as np
                from PIL import Image

                pixels = np.asarray(Image.open(path))
                digest = "pixels:" + hashlib.sha256(str(pixels.shape).encode() + pixels.tobytes()).hexdigest()[:16]
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        except Exception as exc:  # an unreadable artifact is reported, not fatal
            digest = f"unreadable: {type(exc).__name__}: {exc}"[:200]
        out[re.sub(r"\d{9,}", "N", str(path.relative_to(cdir)))] = digest  # a time stamp in a folder name
    return out


def _run_case(case: Case, repo_paths: dict[str, Path], base: Path, flags: list[str], report: bool,
              timeout: int | None) -> dict:
    """One case on one target (its folder under ``base``): the result record."""
    set_target_flags(flags)
    slug = _slug(case.name)
    cdir = base / slug
    shutil.rmtree(cdir, ignore_errors=True)
    cdir.mkdir(parents=True)
    t0 = time.time()
    try:
        cmd, cwd = case.build(repo_paths[case.repo], cdir)
        cmd = with_target_flags(cmd, [*flags, *(_report_flags(cdir) if report else [])])
        env = {**_env(case.extra_path, repo_paths[case.repo], base),
               **{k: v.format(work=cdir) for k, v in case.env.items()}}
        front = [*(str(repo_paths[r]) for r in case.with_repos),
                 *(str(HERE / p.format(work=cdir)) for p in case.paths)]  # HERE / an absolute path: that path
        if front:
            env["PYTHONPATH"] = os.pathsep.join([*front, env["PYTHONPATH"]])
        res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout or case.timeout)
        out = res.stdout + "\n" + res.stderr
        error = (f"exit code {res.returncode}: {_reason(res.stderr)}" if res.returncode != 0
                 else case.check(cdir, out))
        rc = res.returncode
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        error, rc, cmd = f"timed out after {exc.timeout} s", None, exc.cmd
    except Exception as exc:  # a fixture failed
        error, rc, out, cmd = f"harness: {type(exc).__name__}: {exc}", None, "", []
    (cdir / "output.log").write_text(out)
    seconds = round(time.time() - t0, 1)
    return _score(case, {"ok": error is None, "error": error, "seconds": seconds, "returncode": rc,
                         "command": [str(c) for c in cmd], "log": str(cdir / "output.log")}, report)


def _score(case: Case, r: dict, report: bool) -> dict:
    """A run's record with what its output and folder say: the metric, the artifacts' digests, the routing."""
    cdir = Path(r["log"]).parent
    out = Path(r["log"]).read_text() if Path(r["log"]).is_file() else ""
    try:
        metric = case.metric(cdir, out) if case.metric is not None else None
    except Exception as exc:
        metric = [f"metric unreadable: {type(exc).__name__}: {exc}"]
    return {**r, "metric": metric, "artifacts": _artifacts(case, cdir) if r["ok"] else {},
            "routing": _routing(cdir) if report else None}


CLOSE_RTOL = 1e-3  # "close": every printed number within this relative difference, or one unit of its last digit


def _last_digit(x: float) -> float:
    """One unit of the last digit ``x`` was printed with (2.28 -> 0.01, 6.9000e+00 -> 0.0001): common.Printed keeps
    the text (a plain float: its shortest spelling)."""
    mantissa, _, exp = getattr(x, "text", repr(x)).strip().lower().partition("e")
    decimals = len(mantissa.partition(".")[2]) if "." in mantissa else 0
    return 10.0 ** (-decimals + (int(exp) if exp else 0))


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= max(CLOSE_RTOL * max(abs(x), abs(y)), _last_digit(x), _last_digit(y)) * (1 + 1e-9)


def _compare(ref: dict, got: dict) -> dict:
    """The target's metric and artifacts against the reference pass's: ``metric_equal`` (exactly, as printed),
    the largest relative difference of the numbers, and a verdict: same; close (each number within CLOSE_RTOL
    or one unit of the last digit printed); different; none (nothing printed to compare); failed (a run failed)."""
    a, b = ref.get("metric"), got.get("metric")
    equal = None if a is None or b is None else (a == b and len(a) > 0)
    numbers = bool(a and b and len(a) == len(b) and all(isinstance(x, float) for x in [*a, *b]))
    worst = max((abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b)), default=0.0) if numbers else None
    if not (ref.get("ok") and got.get("ok")):
        verdict = "failed"
    elif equal is None:
        verdict = "none"
    elif equal:
        verdict = "same"
    elif numbers and all(_close(x, y) for x, y in zip(a, b)):
        verdict = "close"
    else:
        verdict = "different"
    ra, rb = ref.get("artifacts") or {}, got.get("artifacts") or {}
    same_files = (None if not ra and not rb else ra == rb)
    return {"verdict": verdict, "metric_equal": equal, "max_rel_diff": worst, "artifacts_equal": same_files,
            "artifacts_differ": sorted(k for k in set(ra) | set(rb) if ra.get(k) != rb.get(k))}


def _meta(argv: list[str]) -> dict:
    import platform

    import torch

    try:
        from torch_adapter.core.cpu_features import cpu_features

        cpu = cpu_features().as_dict()
    except ImportError:  # pragma: no cover
        cpu = {}
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "cpu": cpu, "loadavg_start": list(os.getloadavg()), "argv": argv}


def _git_commit(path: Path) -> str | None:
    try:
        res = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def _fmt_metric(m: list | None) -> str:
    if m is None:
        return "-"
    if not m:
        return "(none printed)"
    shown = [f"{v:g}" if isinstance(v, float) else str(v)[:40] for v in m]
    text = ", ".join(shown[:6]) + (f", … ({len(m)})" if len(m) > 6 else "")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkouts", nargs="*", type=Path, help="local checkouts of the public projects")
    ap.add_argument("--rescore", metavar="JSON", help="score a finished run's logs again (a metric changed); runs nothing")
    ap.add_argument("--markdown", metavar="JSON", help="print a finished comparing run's table (README.md's); runs nothing")
    ap.add_argument("--torchvision", metavar="DIR", help="a folder with torchvision installed "
                    "(pip install --no-deps --target DIR torchvision); see README.md")
    ap.add_argument("--only", action="append", default=[], help="run only cases whose name contains this")
    ap.add_argument("--work", type=Path, help="work folder (default: a new temporary folder)")
    ap.add_argument("--json", help="where the JSON goes (default benchmarks/results/realworld.json, or with "
                    "--compare-cpu benchmarks/results/realworld-<target>.json; the committed figure: "
                    "--json docs/figures/realworld-<target>.json)")
    ap.add_argument("--timeout", type=int, help="per-case timeout in seconds (default: per case)")
    ap.add_argument("--target", help="the target every case runs on (torch-adapter run --target; default: auto)")
    ap.add_argument("--emulate", action="store_true", help="run on the emulated TARGET (npu): --target npu --emulate")
    ap.add_argument("--compare-cpu", action="store_true",
                    help="run each case on the CPU target first (float16 as asked: " + " ".join(CPU_REFERENCE)
                         + ") and compare the target's losses / printed metric / written results with it")
    ap.add_argument("--report", action="store_true",
                    help="the target's runs write --report-json (per process): fallbacks and bytes copied per case; "
                         "on by default with --emulate")
    ap.add_argument("--no-report", dest="report", action="store_false")
    ap.set_defaults(report=None)
    args = ap.parse_args(argv)
    if args.rescore:
        return rescore(args.rescore)
    if args.markdown:
        print(markdown_table(args.markdown), end="")
        return 0
    if not args.checkouts:
        ap.error("give at least one checkout")
    if args.emulate and not args.target:
        ap.error("--emulate needs --target (npu)")
    report = args.emulate if args.report is None else args.report
    if args.torchvision:
        _TV.append(str(Path(args.torchvision).resolve()))
    repos: dict[str, Path] = {}
    for path in args.checkouts:
        key = detect(path.resolve())
        if key is None:
            print(f"skip {path}: not a checkout this harness has cases for ({', '.join(REPOS)})")
        else:
            repos[key] = path.resolve()
    work = args.work or Path(tempfile.mkdtemp(prefix="realworld-"))
    flags = _target_flags(args.target, args.emulate)
    passes = [("reference", CPU_REFERENCE, False)] if args.compare_cpu else []
    passes.append(("target", flags, report))
    label = _label(flags)
    # the committed docs/figures/realworld-*.json only when named (--json): a trial run lands in results/
    json_path = args.json or str(ROOT / "benchmarks" / "results" / (f"realworld-{label}.json" if args.compare_cpu
                                                                     else "realworld.json"))
    meta = _meta(sys.argv if argv is None else ["run.py", *argv])
    results = []
    for case in CASES:
        if case.repo not in repos or (args.only and not any(s in case.name for s in args.only)):
            continue
        missing = [r for r in case.with_repos if r not in repos]
        if missing:
            print(f"skip {case.name}: it imports {', '.join(missing)}: pass that checkout too")
            continue
        row: dict = {"case": case.name, "repo": case.repo, "metric_note": case.metric_note}
        for role, pflags, preport in passes:
            r = _run_case(case, repos, work / _label(pflags), pflags, preport, args.timeout)
            row[role] = r
            _print_run(case, _label(pflags), r)
        _finish(case, row, args.compare_cpu)
        results.append(row)
    _write(json_path, meta, label, flags, args.compare_cpu, repos, results)
    print(f"JSON: {json_path}; logs: {work}")
    return 0 if all(r["pass"] for r in results) else 1


def _print_run(case: Case, name: str, r: dict) -> None:
    print(f"{'ok  ' if r['ok'] else 'FAIL'} [{name}] {case.name} ({r['seconds']:g} s)"
          + ("" if r["ok"] else f"\n     {r['error']}\n     log: {r['log']}"), flush=True)
    if r["metric"] is not None:
        print(f"     {case.metric_note or 'metric'}: {_fmt_metric(r['metric'])}", flush=True)
    rt = r.get("routing")
    if rt:
        print(f"     fallbacks: {rt['fallback_ops']} ops ({rt['ops_that_copied']} copied), {rt['fallback_calls']} calls, "
              f"{rt['bytes_to_cpu'] / 1e6:.2f} MB to the CPU, {rt['bytes_from_cpu'] / 1e6:.2f} MB back", flush=True)


def _finish(case: Case, row: dict, compare_cpu: bool) -> None:
    """The row's verdict (comparing: both runs ok, and the metric and the results equal where the case is
    deterministic), printed."""
    row["ok"] = row["target"]["ok"]
    if not compare_cpu:
        row["pass"] = row["ok"]
        return
    cmp = _compare(row["reference"], row["target"])
    cmp["comparable"] = case.deterministic
    row["compare"] = cmp
    files = cmp["artifacts_equal"]
    # the printed metric decides; where a program prints none, what it wrote does (its results' bytes, tensors
    # or pixels); written results that differ under an equal or close metric are reported, not failed
    if cmp["verdict"] == "failed":
        agree = False
    elif cmp["verdict"] == "none":
        agree = files is not False
    else:
        agree = cmp["verdict"] in ("same", "close")
    row["pass"] = bool(row["reference"]["ok"] and row["target"]["ok"] and (not case.deterministic or agree))
    if not case.deterministic:
        verdict = f"not comparable ({case.metric_note.split('; ')[-1]})"
    else:
        verdict = {"same": "same", "close": "close", "different": "DIFFERENT", "none": "no metric",
                   "failed": "not compared (a run failed)"}[cmp["verdict"]]
    if cmp["max_rel_diff"]:
        verdict += f" (max rel diff {cmp['max_rel_diff']:.2e})"
    if files is not None:
        verdict += "; results " + ("identical" if files else "differ: " + ", ".join(cmp["artifacts_differ"]))
    print(f"     {verdict}", flush=True)


def _write(json_path: str, meta: dict, label: str, flags: list[str], compare_cpu: bool, repos: dict,
           results: list[dict]) -> None:
    passed = sum(r["pass"] for r in results)
    print(f"{passed} passed, {len(results) - passed} failed")
    meta.setdefault("loadavg_end", list(os.getloadavg()))
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps({
        "schema": "torch-adapter.realworld", "version": 2, "meta": meta, "target": label,
        "target_flags": flags, "reference_flags": CPU_REFERENCE if compare_cpu else None,
        "passed": passed, "failed": len(results) - passed,
        "checkouts": {k: ({"path": str(v), "commit": _git_commit(v)} if isinstance(v, Path) else v)
                      for k, v in repos.items()},
        "cases": results}, indent=1) + "\n")


def _fmt_fallbacks(routing: dict | None) -> str:
    if not routing or not routing.get("fallbacks"):
        return "none"
    parts = []
    for op, f in sorted(routing["fallbacks"].items(), key=lambda kv: -kv[1]["calls"]):
        moved = f["bytes_to_cpu"] + f["bytes_from_cpu"]
        parts.append(f"`{op.removeprefix('aten::')}` ×{f['calls']} ({moved / 1e3:.1f} kB)" if moved
                     else f"`{op.removeprefix('aten::')}` ×{f['calls']} (no copy)")
    return "; ".join(parts)


def markdown_table(json_path: str) -> str:
    """README.md's table of a comparing run (``--compare-cpu``): each case's printed values on both targets,
    the verdict, the target's fallbacks (calls, bytes copied) and pass."""
    data = json.loads(Path(json_path).read_text())
    ref_name = "CPU target"
    lines = [f"| case | {ref_name} | {data['target']} | equal? | fallbacks on the target (calls, bytes copied) | pass |",
             "|---|---|---|---|---|---|"]
    verdicts = {"same": "yes", "close": "close", "differ": "**no**", "none": "no loss printed", "failed": "—"}

    def shown(r: dict) -> str:
        if not r["ok"]:
            return "failed"
        return "—" if r["metric"] is None else _fmt_metric(r["metric"]).replace("\n", "⏎").replace("|", "/")

    for row in data["cases"]:
        cmp = row.get("compare") or {}
        eq = verdicts.get(cmp.get("verdict"), str(cmp.get("verdict")))
        if cmp.get("verdict") == "close" and cmp.get("max_rel_diff") is not None:
            eq += f" ({cmp['max_rel_diff']:.1e})"
        if not cmp.get("comparable", True):
            eq = "not comparable"
        if cmp.get("artifacts_equal") is True:
            eq += "; written results identical"
        elif cmp.get("artifacts_equal") is False:
            eq += "; written results differ"
        lines.append(f"| {row['case']} | {shown(row['reference'])} | {shown(row['target'])} | {eq} | "
                     f"{_fmt_fallbacks(row['target'].get('routing'))} | {'ok' if row['pass'] else '**FAIL**'} |")
    return "\n".join(lines) + "\n"


def rescore(json_path: str) -> int:
    """Score a finished run again from its logs and folders (after a metric's pattern changed): the JSON is
    rewritten in place, nothing is run."""
    data = json.loads(Path(json_path).read_text())
    by_name = {c.name: c for c in CASES}
    compare_cpu = data.get("reference_flags") is not None
    results = []
    for row in data["cases"]:
        case = by_name.get(row["case"])
        if case is None:
            results.append(row)
            continue
        row["metric_note"] = case.metric_note
        for role in ("reference", "target"):
            if role in row:
                row[role] = _score(case, row[role], row[role].get("routing") is not None)
                _print_run(case, role, row[role])
        _finish(case, row, compare_cpu)
        results.append(row)
    _write(json_path, data["meta"], data["target"], data["target_flags"], compare_cpu, data["checkouts"], results)
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
