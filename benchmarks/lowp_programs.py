"""CUDA-written, device-aware inference programs for ``bench_lowp.py`` (run unchanged, plain or adapted).

Each chooses its dtype the way diffusers' pipelines and example scripts do
(``torch.float16 if device == "cuda" else torch.float32``): plain CPU torch takes the float32
path, the adapter the float16 one. Random weights from configs, no downloads.

    python benchmarks/lowp_programs.py unet [--steps N]
    python -m torch_adapter run benchmarks/lowp_programs.py class_images --folder DIR
    python benchmarks/lowp_programs.py build --folder DIR   # the tiny pipeline (and DIR/wide), saved once
    python -m torch_adapter run benchmarks/lowp_programs.py validation --folder DIR --wide --size 64

Prints one JSON line: ``{"program", "ms": [wall per timed call], "cpu_ms": [process CPU], "minor_faults": [per call],
"dtype", "size"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float16 if DEVICE == "cuda" else torch.float32
if DEVICE == "cpu" and os.environ.get("LOWP_PLAIN_DTYPE"):  # bench_lowp's bf16_plain: the CPU path in another dtype
    DTYPE = getattr(torch, os.environ["LOWP_PLAIN_DTYPE"])


def _unet_config(channels: tuple[int, ...] = (64, 128), sample: int = 32, cross: int = 64) -> dict:
    return dict(sample_size=sample, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=channels,
                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=cross,
                attention_head_dim=8, norm_num_groups=32)


def unet(steps: int, profile: int = 0) -> dict:
    """The issue's program: a small SD UNet forward, weights ``.to(device, dtype)``, ``torch.autocast(device)``."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    model = UNet2DConditionModel(**_unet_config()).eval().to(DEVICE, DTYPE)
    x = torch.randn(2, 4, 32, 32, device=DEVICE, dtype=DTYPE)
    t = torch.tensor([10, 10], device=DEVICE)
    text = torch.randn(2, 8, 64, device=DEVICE, dtype=DTYPE)

    def call() -> None:
        with torch.no_grad(), torch.autocast(DEVICE, enabled=DEVICE == "cuda"):
            model(x, t, encoder_hidden_states=text)

    return _timed(call, steps, profile)


def build(folder: str) -> None:
    """A tiny SD1.5-layout pipeline (random weights) saved in float32 to ``folder``."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel

    from benchmarks.realworld import fixtures

    small = Path(folder) / "_small"
    fixtures.tiny_sd(small)  # tokenizer, text encoder, scheduler from the acceptance fixtures
    pipe = StableDiffusionPipeline.from_pretrained(small, safety_checker=None)
    torch.manual_seed(0)
    pipe.unet = UNet2DConditionModel(**_unet_config((64, 128), 16, 32))
    pipe.vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64),
                             down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                             norm_num_groups=32, sample_size=32)
    pipe.save_pretrained(folder)
    # the same pipeline with an SD-like UNet width (SD 1.5: 320 channels, 8 heads of 40): the tiny
    # one's head dims of 8 and 16 make attention exp-bound and every op overhead-bound
    torch.manual_seed(0)
    pipe.unet = UNet2DConditionModel(**{**_unet_config((160, 320), 16, 32), "attention_head_dim": 4})
    pipe.save_pretrained(Path(folder) / "wide")


def pipeline(folder: str, steps: int, autocast: bool, size: int = 32, profile: int = 0) -> dict:
    """DreamBooth class images (``torch_dtype`` by device) or LoRA/ControlNet validation (the same
    under ``torch.autocast(device)``): 4 denoising steps per image, ``size`` pixels square (the tiny
    VAE halves it: 32 px gives 16x16 latents, 64 px 32x32)."""
    from diffusers import StableDiffusionPipeline
    from diffusers.utils import logging

    logging.set_verbosity_error()
    pipe = StableDiffusionPipeline.from_pretrained(folder, torch_dtype=DTYPE, safety_checker=None).to(DEVICE)
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator(DEVICE).manual_seed(0)

    def call() -> None:
        with torch.autocast(DEVICE, enabled=autocast and DEVICE == "cuda"):
            pipe("red circle", num_inference_steps=4, height=size, width=size, generator=generator, output_type="np")

    return _timed(call, steps, profile)


def _profiled(call, calls: int) -> dict[str, list[float]]:
    """aten op -> [self CPU microseconds per call of the program, op calls per call] over ``calls`` calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
    return {e.key: [e.self_cpu_time_total / calls, e.count / calls] for e in prof.key_averages()}


def _timed(call, steps: int, profile: int = 0) -> dict:
    """Wall and process CPU milliseconds per call (CPU time: what a loaded machine disturbs least), and
    the minor page faults per call: glibc's heap may hand memory back and fault it in again every call,
    in some processes and not others (0 to ~2,800 faults per call of the tiny pipeline in plain torch,
    ~5 us each here), the main cause of the spread between fresh interpreters. ``profile``: then that
    many calls under torch.profiler, per-op self times under ``ops`` (lowp_attribution.py)."""
    call()  # warm-up (first-call allocations, kernel choices)
    wall, cpu, faults = [], [], []
    for _ in range(steps):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0, c0 = time.perf_counter(), time.process_time()
        call()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return {"ms": wall, "cpu_ms": cpu, "minor_faults": faults, **({"ops": _profiled(call, profile)} if profile else {})}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("program", choices=("unet", "class_images", "validation", "build"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--folder")
    parser.add_argument("--size", type=int, default=32, help="pipeline image size in pixels (latents: half)")
    parser.add_argument("--wide", action="store_true", help="the pipeline with the SD-like UNet width (build makes both)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="then N calls under torch.profiler: per-op self times in the JSON's 'ops'")
    args = parser.parse_args()
    if args.program == "build":
        build(args.folder)
        return
    if args.program == "unet":
        got = unet(args.steps, args.profile)
    else:
        folder = f"{args.folder}/wide" if args.wide else args.folder
        got = pipeline(folder, args.steps, autocast=args.program == "validation", size=args.size, profile=args.profile)
    print(json.dumps({"program": args.program, **got, "dtype": str(DTYPE), "size": args.size, "wide": args.wide}))


if __name__ == "__main__":
    main()
