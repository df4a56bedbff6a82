"""A synthetic image-caption dataset and a tokenizer for it, both built locally.

Images are coloured shapes (circles, squares, triangles) on plain backgrounds, drawn
with PIL; each caption says what is drawn: "a small red circle on a blue background".
Every sample is a pure function of (seed, index), so any worker process, any rank and
any resumed run sees the same data.

The tokenizer is a word-level tokenizer over the caption vocabulary, built with the
`tokenizers` library and wrapped in transformers' ``PreTrainedTokenizerFast``. It uses
CLIP's special tokens and padding (``<|startoftext|>``, ``<|endoftext|>`` as end and
pad, 77 positions), so a real ``CLIPTokenizer.from_pretrained(...)`` can replace it
without touching the training loop.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset
from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 40),
    "purple": (140, 60, 180),
    "orange": (245, 140, 30),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle")
SIZES = ("small", "large")

BOS, EOS, UNK = "<|startoftext|>", "<|endoftext|>", "<|unk|>"
CAPTION_WORDS = ("a", "on", "background", *SIZES, *SHAPES, *COLOURS)


def build_tokenizer(model_max_length: int = 77) -> PreTrainedTokenizerFast:
    """A CLIP-style word-level tokenizer for the synthetic captions (no download)."""
    vocab = {token: i for i, token in enumerate((BOS, EOS, UNK, *CAPTION_WORDS))}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, vocab[BOS]), (EOS, vocab[EOS])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=EOS,
        model_max_length=model_max_length)


def tokenize_captions(tokenizer, captions: list[str]) -> torch.Tensor:
    """Token ids padded to the text encoder's length, as the diffusers training scripts do."""
    return tokenizer(captions, max_length=tokenizer.model_max_length, padding="max_length",
                     truncation=True, return_tensors="pt").input_ids


def _shape_points(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if shape == "triangle":
        return [(cx + r * math.cos(a), cy + r * math.sin(a))
                for a in (-math.pi / 2, -math.pi / 2 + 2 * math.pi / 3, -math.pi / 2 + 4 * math.pi / 3)]
    return [(cx - r, cy - r), (cx + r, cy + r)]


def render_sample(rng: random.Random, resolution: int) -> tuple[Image.Image, str]:
    """One image and its caption, drawn from ``rng``."""
    shape = rng.choice(SHAPES)
    colour = rng.choice(list(COLOURS))
    background = rng.choice([c for c in COLOURS if c != colour])
    size = rng.choice(SIZES)
    radius = resolution * (rng.uniform(0.12, 0.2) if size == "small" else rng.uniform(0.28, 0.38))
    cx = rng.uniform(radius, resolution - radius)
    cy = rng.uniform(radius, resolution - radius)

    image = Image.new("RGB", (resolution, resolution), COLOURS[background])
    draw = ImageDraw.Draw(image)
    points = _shape_points(shape, cx, cy, radius)
    if shape == "circle":
        draw.ellipse(points, fill=COLOURS[colour])
    elif shape == "square":
        draw.rectangle(points, fill=COLOURS[colour])
    else:
        draw.polygon(points, fill=COLOURS[colour])
    return image, f"a {size} {colour} {shape} on a {background} background"


def image_to_tensor(image: Image.Image) -> torch.Tensor:
    """PIL RGB -> float (3, H, W) in [-1, 1] (ToTensor + Normalize([0.5], [0.5]))."""
    array = np.asarray(image, dtype=np.float32) / 127.5 - 1.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


class ShapesDataset(Dataset):
    """``num_samples`` synthetic (pixel_values, input_ids) pairs, rendered on demand."""

    def __init__(self, tokenizer, num_samples: int = 1024, resolution: int = 64,
                 seed: int = 0, random_flip: bool = True):
        self.tokenizer = tokenizer
        self.num_samples = num_samples
        self.resolution = resolution
        self.seed = seed
        self.random_flip = random_flip

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        rng = random.Random(self.seed * 1_000_003 + index)
        image, caption = render_sample(rng, self.resolution)
        if self.random_flip and rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return {
            "pixel_values": image_to_tensor(image),
            "input_ids": tokenize_captions(self.tokenizer, [caption])[0],
        }


def collate_fn(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.stack([e["pixel_values"] for e in examples]),
        "input_ids": torch.stack([e["input_ids"] for e in examples]),
    }
