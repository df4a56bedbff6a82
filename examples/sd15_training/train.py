#!/usr/bin/env python
"""Fine-tune Stable Diffusion v1.5 (text-to-image) on one or more CUDA GPUs.

Shaped like diffusers' examples/text_to_image/train_text_to_image.py, in plain PyTorch
(no accelerate): a frozen CLIP text encoder and KL VAE, a trainable UNet, the DDPM
noise-prediction loss, AdamW, fp16/bf16 autocast with GradScaler, an EMA of the UNet,
gradient checkpointing, DistributedDataParallel over NCCL, checkpoints and resume.

Models are built from the SD v1.5 configs with random weights and trained on a
synthetic shapes-and-captions dataset, so nothing is downloaded (see models.py and
data.py). ``--config tiny`` (default) is small enough for a laptop; ``--config full`` is
the real SD v1.5 size.

    python train.py --max-steps 100                       # one GPU
    torchrun --nproc-per-node 8 train.py --config full    # 8 GPUs, NCCL
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import math
import os
import re
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers import UNet2DConditionModel
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from data import ShapesDataset, build_tokenizer, collate_fn
from models import CONFIGS, EinsumAttnProcessor, build_models, build_noise_scheduler, count_parameters


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Stable Diffusion v1.5 fine-tuning (CUDA).")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny",
                        help="model sizes: 'tiny' (seconds per step on a CPU) or 'full' (real SD v1.5, GPU).")
    parser.add_argument("--output-dir", default=os.path.join(tempfile.gettempdir(), "sd15-finetuned"),
                        help="checkpoints, tokenizer and final UNet go here (default: sd15-finetuned in the "
                             "system's temporary folder, not the current one).")
    parser.add_argument("--max-steps", type=int, default=1000,
                        help="optimizer steps to train for (in total, across resumes).")
    parser.add_argument("--batch-size", type=int, default=4, help="images per GPU per micro-batch.")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--resolution", type=int, default=None,
                        help="image size in pixels (default: the config's, 64 tiny / 512 full).")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--lr-scheduler", default="constant",
                        choices=["linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
                                 "constant_with_warmup"])
    parser.add_argument("--lr-warmup-steps", type=int, default=0)
    parser.add_argument("--adam-beta1", type=float, default=0.9)
    parser.add_argument("--adam-beta2", type=float, default=0.999)
    parser.add_argument("--adam-weight-decay", type=float, default=1e-2)
    parser.add_argument("--adam-epsilon", type=float, default=1e-8)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--noise-offset", type=float, default=0.0, help="offset noise strength (0 disables).")
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default="fp16")
    parser.add_argument("--use-ema", action="store_true", help="keep an exponential moving average of the UNet.")
    parser.add_argument("--ema-decay", type=float, default=0.9999)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--checkpointing-steps", type=int, default=500, help="save a checkpoint every N steps.")
    parser.add_argument("--resume", default=None,
                        help="a checkpoint file to resume from, or 'latest' for the newest in --output-dir.")
    parser.add_argument("--num-samples", type=int, default=1024, help="size of the synthetic dataset.")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes.")
    parser.add_argument("--log-every", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--ddp", action="store_true",
                        help="initialise torch.distributed even for one process (implied when WORLD_SIZE > 1).")
    parser.add_argument("--local-rank", "--local_rank", type=int, default=-1,
                        help="set by torch.distributed.launch; torchrun sets LOCAL_RANK instead.")
    args = parser.parse_args(argv)

    if args.resolution is None:
        args.resolution = CONFIGS[args.config].resolution
    if args.resolution % 64:
        parser.error(f"--resolution must be a multiple of 64 (8x VAE, 3 UNet downsamples), got {args.resolution}")
    if min(args.max_steps, args.batch_size, args.gradient_accumulation_steps, args.checkpointing_steps) < 1:
        parser.error("--max-steps, --batch-size, --gradient-accumulation-steps and --checkpointing-steps must be >= 1")
    if args.local_rank != -1:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    return args


# --- distributed ------------------------------------------------------------------------

def setup_distributed(args: argparse.Namespace) -> tuple[bool, int, int, int]:
    """(distributed, rank, local_rank, world_size); one process per GPU, NCCL between them."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1 and not args.ddp:
        return False, 0, 0, 1
    if args.ddp and "RANK" not in os.environ:  # --ddp without a launcher: a group of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    return True, dist.get_rank(), local_rank, dist.get_world_size()


def mean_over_ranks(value: torch.Tensor, distributed: bool) -> torch.Tensor:
    value = value.detach().clone()
    if distributed:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= dist.get_world_size()
    return value


# --- checkpoints ------------------------------------------------------------------------

def checkpoint_path(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"checkpoint-{step}.pt")


def latest_checkpoint(output_dir: str) -> str | None:
    found = []
    for path in glob.glob(os.path.join(output_dir, "checkpoint-*.pt")):
        match = re.fullmatch(r"checkpoint-(\d+)\.pt", os.path.basename(path))
        if match:
            found.append((int(match.group(1)), path))
    return max(found)[1] if found else None


def save_checkpoint(path: str, *, step: int, loss: float, unet, optimizer, lr_scheduler, scaler, ema_unet,
                    args) -> None:
    state = {
        "step": step,
        "loss": loss,
        "unet": unet.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "ema": ema_unet.state_dict() if ema_unet is not None else None,
        "args": vars(args),
    }
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-save never leaves a truncated checkpoint behind


def load_checkpoint(path: str, device: torch.device, *, unet, optimizer, lr_scheduler, scaler,
                    ema_unet) -> tuple[int, float]:
    """Restore the training state in place; returns (step, loss) of the checkpoint."""
    state = torch.load(path, map_location=device, weights_only=True)
    unet.load_state_dict(state["unet"])
    optimizer.load_state_dict(state["optimizer"])
    lr_scheduler.load_state_dict(state["lr_scheduler"])
    scaler.load_state_dict(state["scaler"])
    if ema_unet is not None:
        if state["ema"] is None:
            raise SystemExit(f"{path} has no EMA weights; resume without --use-ema or from a --use-ema run")
        ema_unet.load_state_dict(state["ema"])
        ema_unet.to(device)
    return state["step"], state["loss"]


# --- training ---------------------------------------------------------------------------

def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("This script trains on CUDA GPUs and none is available "
                         "(on other hardware run it with `python -m torch_adapter run train.py ...`).")

    distributed, rank, local_rank, world_size = setup_distributed(args)
    device = torch.device("cuda", local_rank)
    is_main = rank == 0

    def log(msg: str) -> None:
        if is_main:
            print(msg, flush=True)

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True

    # Same seed everywhere for identical initial weights (DDP also broadcasts them).
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)  # torch.manual_seed seeds CUDA too; explicit, as set_seed helpers do

    if is_main:
        os.makedirs(args.output_dir, exist_ok=True)

    config = CONFIGS[args.config]
    tokenizer = build_tokenizer(model_max_length=config.text_encoder["max_position_embeddings"])
    text_encoder, vae, unet = build_models(config, tokenizer, args.resolution)
    noise_scheduler = build_noise_scheduler()
    if is_main:
        tokenizer.save_pretrained(os.path.join(args.output_dir, "tokenizer"))
    log(f"device: {torch.cuda.get_device_name(device)} x {world_size}; config {args.config}, "
        f"{args.resolution}px, mixed precision {args.mixed_precision}")
    log(f"unet {count_parameters(unet) / 1e6:.2f}M params (trained), "
        f"vae {count_parameters(vae) / 1e6:.2f}M, text encoder {count_parameters(text_encoder) / 1e6:.2f}M (frozen)")

    # Frozen parts: no gradients, eval mode. The text encoder runs in half precision when
    # training mixed; the VAE stays fp32 (SD's VAE overflows in fp16, so diffusers' SDXL
    # script keeps it in fp32 too). The trained UNet keeps fp32 weights under autocast.
    vae.requires_grad_(False)
    text_encoder.requires_grad_(False)
    vae.eval()
    text_encoder.eval()

    weight_dtype = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.mixed_precision]
    use_amp = args.mixed_precision != "no"
    vae.to(device)
    text_encoder.to(device, dtype=weight_dtype)
    unet.cuda()

    unet.set_attn_processor(EinsumAttnProcessor())
    if args.gradient_checkpointing:
        unet.enable_gradient_checkpointing()

    ema_unet = None
    if args.use_ema:
        ema_unet = EMAModel(unet.parameters(), decay=args.ema_decay,
                            model_cls=UNet2DConditionModel, model_config=unet.config)
        ema_unet.to(device)

    optimizer = torch.optim.AdamW(
        unet.parameters(), lr=args.lr, betas=(args.adam_beta1, args.adam_beta2),
        weight_decay=args.adam_weight_decay, eps=args.adam_epsilon)
    lr_scheduler = get_scheduler(
        args.lr_scheduler, optimizer=optimizer,
        num_warmup_steps=args.lr_warmup_steps, num_training_steps=args.max_steps)
    # Loss scaling guards fp16 gradients from underflow; bf16 has fp32's range and needs none.
    scaler = torch.amp.GradScaler("cuda", enabled=args.mixed_precision == "fp16")

    dataset = ShapesDataset(tokenizer, num_samples=args.num_samples, resolution=args.resolution, seed=args.seed)
    # A DistributedSampler also for one process: the shuffle is a function of (seed, epoch),
    # so a resumed run continues the same data order.
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, collate_fn=collate_fn,
                        num_workers=args.num_workers, pin_memory=True, drop_last=True,
                        persistent_workers=args.num_workers > 0)
    total_batch = args.batch_size * world_size * args.gradient_accumulation_steps
    updates_per_epoch = len(loader) // args.gradient_accumulation_steps
    if updates_per_epoch == 0:
        raise SystemExit(f"--num-samples {args.num_samples} is too small for {world_size} x --batch-size "
                         f"{args.batch_size} x --gradient-accumulation-steps {args.gradient_accumulation_steps}")

    global_step, last_loss = 0, float("nan")
    resume_from = latest_checkpoint(args.output_dir) if args.resume == "latest" else args.resume
    if args.resume == "latest" and resume_from is None:
        log(f"no checkpoint in {args.output_dir}; starting from scratch")
    if resume_from:
        global_step, last_loss = load_checkpoint(
            resume_from, device, unet=unet, optimizer=optimizer, lr_scheduler=lr_scheduler,
            scaler=scaler, ema_unet=ema_unet)
        log(f"resumed from {resume_from} at step {global_step}")

    unwrapped_unet = unet
    if distributed:
        unet = DDP(unet, device_ids=[local_rank], output_device=local_rank)

    # Different noise and timesteps on every rank (and after a resume).
    torch.manual_seed(args.seed + 1000 * rank + global_step)

    log(f"{len(dataset)} samples, total batch {total_batch}, steps {global_step} -> {args.max_steps}")

    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    torch.cuda.reset_peak_memory_stats(device)
    unet.train()

    epoch = global_step // updates_per_epoch
    skip_batches = (global_step % updates_per_epoch) * args.gradient_accumulation_steps
    micro_step, running_loss = 0, torch.zeros((), device=device)
    if global_step >= args.max_steps:
        log(f"nothing to train: the checkpoint is at step {global_step}, --max-steps is {args.max_steps}")
    train_start = time.perf_counter()

    while global_step < args.max_steps:
        sampler.set_epoch(epoch)
        for batch_index, batch in enumerate(loader):
            if batch_index < skip_batches:
                continue
            if micro_step == 0:
                start_event.record()

            pixel_values = batch["pixel_values"].to(device, non_blocking=True)
            input_ids = batch["input_ids"].to(device, non_blocking=True)

            with torch.no_grad():
                latents = vae.encode(pixel_values).latent_dist.sample() * vae.config.scaling_factor
                encoder_hidden_states = text_encoder(input_ids, return_dict=False)[0]

            noise = torch.randn_like(latents)
            if args.noise_offset:
                noise += args.noise_offset * torch.randn(
                    (latents.shape[0], latents.shape[1], 1, 1), device=latents.device, dtype=latents.dtype)
            bsz = latents.shape[0]
            timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,), device=latents.device)
            noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
            if noise_scheduler.config.prediction_type == "epsilon":
                target = noise
            else:
                target = noise_scheduler.get_velocity(latents, noise, timesteps)

            micro_step += 1
            sync_now = micro_step == args.gradient_accumulation_steps
            # Skip DDP's gradient all-reduce on the accumulation micro-steps.
            sync_ctx = unet.no_sync() if distributed and not sync_now else contextlib.nullcontext()
            with sync_ctx:
                with torch.autocast("cuda", dtype=weight_dtype, enabled=use_amp):
                    model_pred = unet(noisy_latents, timesteps, encoder_hidden_states, return_dict=False)[0]
                loss = F.mse_loss(model_pred.float(), target.float(), reduction="mean")
                scaler.scale(loss / args.gradient_accumulation_steps).backward()
            running_loss += loss.detach() / args.gradient_accumulation_steps
            if not sync_now:
                continue

            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(unet.parameters(), args.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            lr_scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if ema_unet is not None:
                ema_unet.step(unwrapped_unet.parameters())
            global_step += 1

            end_event.record()
            torch.cuda.synchronize(device)
            step_ms = start_event.elapsed_time(end_event)
            last_loss = mean_over_ranks(running_loss, distributed).item()
            micro_step, running_loss = 0, torch.zeros((), device=device)
            if not math.isfinite(last_loss):
                raise SystemExit(f"step {global_step}: loss is {last_loss}; lower --lr or use --mixed-precision bf16")

            if global_step % args.log_every == 0 or global_step == args.max_steps:
                log(f"step {global_step}/{args.max_steps} loss {last_loss:.4f} grad_norm {grad_norm.item():.3f} "
                    f"lr {lr_scheduler.get_last_lr()[0]:.2e} step_time {step_ms:.1f} ms "
                    f"({total_batch / (step_ms / 1000):.1f} img/s) "
                    f"max_mem {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB")

            if global_step % args.checkpointing_steps == 0 or global_step == args.max_steps:
                if is_main:
                    path = checkpoint_path(args.output_dir, global_step)
                    save_checkpoint(path, step=global_step, loss=last_loss, unet=unwrapped_unet, optimizer=optimizer,
                                    lr_scheduler=lr_scheduler, scaler=scaler, ema_unet=ema_unet, args=args)
                    log(f"saved {path}")
                if distributed:
                    dist.barrier()
            if global_step >= args.max_steps:
                break
        epoch += 1
        skip_batches = 0

    # Final weights, diffusers layout: the EMA weights when kept, as the diffusers example does.
    if is_main:
        if ema_unet is not None:
            ema_unet.copy_to(unwrapped_unet.parameters())
        unwrapped_unet.save_pretrained(os.path.join(args.output_dir, "unet"))
    log(f"trained for {time.perf_counter() - train_start:.1f} s")
    log(f"done: {global_step} steps, final loss {last_loss:.4f}")

    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
