"""The built-in model families that ``torch-adapter coverage`` measures, as data.

Each :class:`Family` names a factory: a function without arguments returning
``(model, example_inputs, loss_fn)`` (user factories may leave ``loss_fn`` out; loading
and checking them is :mod:`.factories`). The built-in families (:data:`FAMILIES`) are tiny,
randomly initialised models built from configs (nothing is downloaded), sized so that
one training step takes well under a second on a CPU. diffusers and transformers are
imported only when their factory runs.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UsageError, format_error
from ._demo_op import DEMO_OP, demo_op

__all__ = ["Family", "FAMILIES", "DEMO_OP", "demo_op", "builtin_names", "family"]


@dataclass(frozen=True)
class Family:
    """A model family: a name, a one-line description, a kind (for grouping) and its factory."""

    name: str
    description: str
    kind: str
    factory: Callable[[], tuple]
    source: str = "built-in"  # or the user's "module:factory"


# -- built-in factories (heavy imports inside) ------------------------------------------------
def _resnet() -> tuple:
    import torch
    from torch import nn

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.short(x))

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        Basic(16, 16, 1), Basic(16, 32, 2), Basic(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    images = torch.randn(8, 3, 32, 32)
    labels = torch.randint(0, 10, (8,))
    return model, (images,), lambda out: nn.functional.cross_entropy(out, labels)


def _token_batch(vocab: int, batch: int = 4, length: int = 16) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.randint(0, vocab, (batch, length))


def _bert() -> tuple:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=3)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    ids = _token_batch(config.vocab_size)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 2, 1])}
    return model, inputs, lambda out: out.loss


def _gpt2() -> tuple:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    ids = _token_batch(config.vocab_size)
    return model, {"input_ids": ids, "labels": ids}, lambda out: out.loss


def _clip_text() -> tuple:
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, max_position_embeddings=77, projection_dim=32,
                            hidden_act="quick_gelu")
    torch.manual_seed(0)
    model = CLIPTextModel(config)
    ids = _token_batch(config.vocab_size)
    return model, {"input_ids": ids}, lambda out: out.last_hidden_state.square().mean() + out.pooler_output.mean()


# The SD v1.5 block layouts (unet/config.json and vae/config.json of runwayml/stable-diffusion-v1-5),
# with tiny widths.
_SD15_UNET = dict(
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    mid_block_type="UNetMidBlock2DCrossAttn",
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    in_channels=4, out_channels=4, sample_size=8, block_out_channels=(32, 32, 32, 32), layers_per_block=1,
    cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32, act_fn="silu",
    flip_sin_to_cos=True, freq_shift=0, downsample_padding=1)
_SD15_VAE = dict(
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    in_channels=3, out_channels=3, latent_channels=4, sample_size=32, block_out_channels=(32, 32, 32, 32),
    layers_per_block=1, norm_num_groups=32, act_fn="silu", scaling_factor=0.18215)


def _sd_unet() -> tuple:
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    model = UNet2DConditionModel(**_SD15_UNET)
    latents = torch.randn(2, 4, 8, 8)
    inputs = {"sample": latents, "timestep": torch.tensor([10, 500]),
              "encoder_hidden_states": torch.randn(2, 8, 32)}
    noise = torch.randn_like(latents)
    return model, inputs, lambda out: torch.nn.functional.mse_loss(out.sample, noise)


def _sd_vae() -> tuple:
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    model = AutoencoderKL(**_SD15_VAE)
    images = torch.randn(1, 3, 32, 32)
    return (model, {"sample": images, "sample_posterior": True},
            lambda out: torch.nn.functional.mse_loss(out.sample, images))


def _lstm() -> tuple:
    import torch
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(256, 32)
            self.lstm = nn.LSTM(32, 32, num_layers=2, batch_first=True)
            self.head = nn.Linear(32, 4)

        def forward(self, ids: Any) -> Any:
            out, _ = self.lstm(self.embed(ids))
            return self.head(out[:, -1])

    torch.manual_seed(0)
    model = Tagger()
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    return model, (_token_batch(256, batch=8),), lambda out: nn.functional.cross_entropy(out, labels)


def _custom_op() -> tuple:
    import torch
    from torch import nn

    op = demo_op()

    class FusedGeluMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(32, 64)
            self.down = nn.Linear(64, 8)

        def forward(self, x: Any) -> Any:
            return self.down(op(self.up(x)))

    torch.manual_seed(0)
    model = FusedGeluMLP()
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    return model, (x,), lambda out: nn.functional.mse_loss(out, y)


FAMILIES: tuple[Family, ...] = (
    Family("resnet", "ResNet-style CNN (3 basic blocks, batch norm), 8x3x32x32 images", "CNN", _resnet),
    Family("bert", "BERT-style encoder (transformers BertConfig: 2 layers, hidden 32), sequence classification",
           "Transformer", _bert),
    Family("gpt2", "GPT-2-style decoder (transformers GPT2Config: 2 layers, n_embd 32), language-model loss",
           "Transformer", _gpt2),
    Family("sd_unet", "SD1.5-architecture UNet2DConditionModel (diffusers, widths 32), 8x8 latents",
           "Diffusion", _sd_unet),
    Family("sd_vae", "SD1.5-architecture AutoencoderKL (diffusers, widths 32), 32x32 images", "Diffusion", _sd_vae),
    Family("clip_text", "CLIP text encoder (transformers CLIPTextConfig: 2 layers, hidden 32)", "Transformer",
           _clip_text),
    Family("lstm", "2-layer LSTM tagger (embedding, nn.LSTM, linear head)", "RNN", _lstm),
    Family("custom_op", f"MLP with a torch.library.custom_op ({DEMO_OP}, CPU kernel only)", "Custom op",
           _custom_op),
)


def builtin_names() -> list[str]:
    return [f.name for f in FAMILIES]


def family(name: str) -> Family:
    """A built-in family by name; UsageError with close matches otherwise."""
    for fam in FAMILIES:
        if fam.name == name:
            return fam
    close = difflib.get_close_matches(name, builtin_names(), n=2, cutoff=0.7)
    raise UsageError(format_error(
        "torch-adapter coverage --models", f"built-in family names ({', '.join(builtin_names())}) or "
        "module:factory, e.g. --models resnet,my_models:build", repr(name),
        why="it is neither a built-in family nor a module:factory reference",
        fix=f"did you mean {' or '.join(close)}?" if close else "add ':factory' to name a function in a module"))
