"""Benchmark workloads, written the CUDA way.

Each workload is a :class:`Workload` whose ``build(device)`` sets up the model, optimizer
and inputs on ``device`` and returns ``step()``: one training step that ends with
``torch.cuda.synchronize()`` when the device is a CUDA device — the way CUDA training
scripts are written (``.to("cuda")``, ``device="cuda"``, synchronize before reading a clock).

Why a ``device`` argument instead of a hard-coded ``"cuda"``: the *plain* configuration
must run the workload with torch untouched, and a CPU-only machine cannot run
``.to("cuda")`` at all. So the harness passes the device each configuration runs on:
plain gets the real device of the machine (``"cuda"`` when a real CUDA device is present,
else ``"cpu"``), an adapted configuration gets ``"cuda"``, which the adapter redirects to
its target. Both then execute the same kernels on the same hardware, and the difference
in throughput is what the adapter costs.

Workloads (names for ``--workload``):

- ``sd_unet`` — an SD1.5-architecture diffusers ``UNet2DConditionModel`` from a tiny config
  (block_out_channels (32, 64), one layer per block, cross-attention dim 32, head dim 8,
  32x32 latents, batch 2, random weights): forward, MSE loss, backward, AdamW step.
  ~3,600 aten calls, ~215 ms per step on 2 idle cores of this machine.
- ``cnn`` — a small conv net (3 conv/batch-norm/ReLU blocks of 32/64/128 channels, pooling,
  linear head) on a batch of 64 RGB 32x32 images: forward, cross-entropy, backward, SGD
  with momentum.
- ``mlp`` — a two-layer perceptron on a batch of 8: a workload of about a millisecond
  for tests of the harness itself.

Nothing is downloaded: models are built from configs with random weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Workload", "WORKLOADS", "get", "sd_unet", "cnn", "mlp"]

Step = Callable[[], None]


@dataclass(frozen=True)
class Workload:
    """A named benchmark step. ``build(device)`` returns the step function."""

    name: str
    build: Callable[[str], Step]
    description: str = ""


def _sync(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _build_sd_unet(device: str = "cuda", *, batch: int = 2, sample_size: int = 32,
                   wrap: Callable[[object], object] | None = None) -> Step:
    """``wrap`` (e.g. ``torch_adapter.prepare``) turns the model into what the step calls."""
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=sample_size,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    ).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = wrap(model) if wrap is not None else model
    latents = torch.randn(batch, 4, sample_size, sample_size, device=device)
    timesteps = torch.randint(0, 1000, (batch,), device=device)
    text = torch.randn(batch, 8, 32, device=device)
    target = torch.randn(batch, 4, sample_size, sample_size, device=device)

    def step() -> None:
        noise_pred = forward(latents, timesteps, encoder_hidden_states=text).sample
        loss = torch.nn.functional.mse_loss(noise_pred, target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)

    return step


def _build_cnn(device: str = "cuda", *, batch: int = 64) -> Step:
    import torch
    from torch import nn

    torch.manual_seed(0)

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    model = nn.Sequential(
        block(3, 32), nn.MaxPool2d(2), block(32, 64), nn.MaxPool2d(2), block(64, 128),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(batch, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)

    return step


def _build_mlp(device: str = "cuda", *, batch: int = 8) -> Step:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 32, device=device)
    y = torch.randn(batch, 4, device=device)

    def step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)

    return step


sd_unet = Workload("sd_unet", _build_sd_unet, "tiny SD1.5-architecture UNet2DConditionModel training step (batch 2, 32x32)")
cnn = Workload("cnn", _build_cnn, "small CNN training step (batch 64, 3x32x32)")
mlp = Workload("mlp", _build_mlp, "two-layer MLP training step (batch 8); for harness tests")

WORKLOADS: dict[str, Workload] = {w.name: w for w in (sd_unet, cnn, mlp)}


def get(name: str) -> Workload:
    """The workload called ``name``; a clear error listing the known names otherwise."""
    try:
        return WORKLOADS[name]
    except KeyError:
        from torch_adapter.errors import UsageError, format_error

        raise UsageError(format_error(
            "benchmarks.workloads.get()", f"one of {sorted(WORKLOADS)}", repr(name),
            fix="pass --workload sd_unet (or cnn, mlp)")) from None
