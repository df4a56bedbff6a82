"""Tiny local models and data for the real-program acceptance run (nothing is downloaded).

Models are built from configs with random weights and saved with ``save_pretrained``;
data sets are a few generated files in the layout each program reads. Everything goes
under the run's work folder; the checkouts are never written to.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import struct
from pathlib import Path

__all__ = ["tiny_sd", "hf_cached_vae", "caption_folder", "image_folder", "mnist_raw", "text_corpus", "nanogpt_chars",
           "llmc_shard", "gpt_fast_checkpoint"]

_WORDS = ["red", "blue", "green", "circle", "square", "small", "large", "a", "on", "white", "black", "triangle"]


def _clip_vocab(folder: Path) -> None:
    """A byte-level BPE vocabulary in CLIP's layout (every byte, alone and word-final; two merges)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    chars = [chr(c) for c in cs]
    tokens = chars + [c + "</w>" for c in chars] + ["re", "red</w>", "<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (folder / "merges.txt").write_text("#version: 0.2\nr e\nre d</w>\n")


def tiny_sd(folder: Path, vae_factor: int = 2) -> Path:
    """A Stable-Diffusion-1.5-layout pipeline folder (unet, vae, text_encoder, tokenizer, scheduler).

    ``vae_factor``: the VAE's downsampling (2 by default; 8 as SD's own, for programs that assume it:
    a ControlNet's conditioning embedding downsamples its image by 8 to meet the latents)."""
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    if (folder / "model_index.json").exists():
        return folder
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    torch.manual_seed(0)
    tok_dir = folder / "_tok"
    tok_dir.mkdir(parents=True, exist_ok=True)
    _clip_vocab(tok_dir)
    tokenizer = CLIPTokenizer(str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"), model_max_length=16)
    text_encoder = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37,
                                                num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16,
                                                projection_dim=32, bos_token_id=tokenizer.bos_token_id,
                                                eos_token_id=tokenizer.eos_token_id, pad_token_id=1))
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=4, norm_num_groups=8)
    levels = vae_factor.bit_length()  # 2 -> 2 blocks (one downsampling), 8 -> 4 blocks
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4,
                        block_out_channels=(8, 16) if levels == 2 else (8,) * levels,
                        down_block_types=("DownEncoderBlock2D",) * levels, up_block_types=("UpDecoderBlock2D",) * levels,
                        norm_num_groups=8, sample_size=16 * vae_factor // 2)
    scheduler = DDPMScheduler(num_train_timesteps=100, beta_schedule="scaled_linear", beta_start=0.00085,
                              beta_end=0.012, clip_sample=False)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(folder)
    return folder


def hf_cached_vae(hf_home: Path, repo_ids: tuple[str, ...], factor: int = 8) -> Path:
    """A tiny random ``AutoencoderKL`` (downsampling FACTOR, 4 latent channels) placed in the Hugging Face
    cache under HF_HOME as each REPO_ID's ``main`` snapshot, so ``from_pretrained(repo_id)`` finds it offline
    (HF_HUB_OFFLINE=1): hub/models--ORG--NAME/snapshots/REV/ and refs/main naming REV."""
    import torch
    from diffusers import AutoencoderKL

    levels = factor.bit_length()  # 8 -> 4 blocks -> 3 downsamplings
    rev = "0" * 39 + "1"
    for repo_id in repo_ids:
        base = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
        snap = base / "snapshots" / rev
        if (snap / "config.json").exists():
            continue
        torch.manual_seed(0)
        vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,) * levels,
                            down_block_types=("DownEncoderBlock2D",) * levels,
                            up_block_types=("UpDecoderBlock2D",) * levels, layers_per_block=1, norm_num_groups=4,
                            sample_size=32)
        vae.save_pretrained(snap)
        (base / "refs").mkdir(parents=True, exist_ok=True)
        (base / "refs" / "main").write_text(rev)
    return hf_home


def _image(rng: random.Random, size: int):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    x, y, r = rng.randrange(size), rng.randrange(size), rng.randrange(2, max(3, size // 3))
    draw.ellipse((x - r, y - r, x + r, y + r), fill=tuple(rng.randrange(256) for _ in range(3)))
    return img


def caption_folder(folder: Path, n: int = 8, size: int = 16) -> Path:
    """An ``imagefolder`` data set with ``metadata.jsonl`` captions (the HF examples' local format)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with open(folder / "metadata.jsonl", "w") as fh:
        for i in range(n):
            _image(rng, size).save(folder / f"{i}.png")
            fh.write(json.dumps({"file_name": f"{i}.png", "text": " ".join(rng.choices(_WORDS, k=4))}) + "\n")
    return folder


def controlnet_folder(folder: Path, n: int = 4, size: int = 64) -> Path:
    """An ``imagefolder`` data set for ControlNet training: ``image``, ``text`` and a second image column,
    ``conditioning_image`` (metadata's ``conditioning_image_file_name``, which datasets loads as an image)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    with open(folder / "metadata.jsonl", "w") as fh:
        for i in range(n):
            _image(rng, size).save(folder / f"{i}.png")
            _image(rng, size).save(folder / f"cond_{i}.png")
            fh.write(json.dumps({"file_name": f"{i}.png", "text": " ".join(rng.choices(_WORDS, k=4)),
                                 "conditioning_image_file_name": f"cond_{i}.png"}) + "\n")
    return folder


def image_folder(folder: Path, classes: int = 2, per_class: int = 4, size: int = 40, splits=("train", "val")) -> Path:
    """``ImageFolder`` layout: SPLIT/CLASS/IMAGE.png (torchvision.datasets.ImageFolder, timm)."""
    rng = random.Random(1)
    for split in splits:
        for c in range(classes):
            d = folder / split / f"class{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                _image(rng, size).save(d / f"{i}.png")
    return folder


def mnist_raw(root: Path, train: int = 64, test: int = 32) -> Path:
    """MNIST's raw idx files under ROOT/MNIST/raw (torchvision.datasets.MNIST finds them, no download)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = random.Random(2)
    for prefix, n in (("train", train), ("t10k", test)):
        images = struct.pack(">IIII", 2051, n, 28, 28) + bytes(rng.randrange(256) for _ in range(n * 784))
        digits = [i % 10 for i in range(n)]  # every digit several times (siamese_network pairs within a class)
        rng.shuffle(digits)
        labels = struct.pack(">II", 2049, n) + bytes(digits)
        for name, data in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
            (raw / name).write_bytes(data)
            with gzip.open(raw / f"{name}.gz", "wb") as fh:
                fh.write(data)
    return root


def text_corpus(folder: Path, lines: int = 60) -> Path:
    """train/valid/test.txt of short word lines (word_language_model's --data layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(3)
    for name, n in (("train.txt", lines), ("valid.txt", lines // 3), ("test.txt", lines // 3)):
        (folder / name).write_text("".join(" ".join(rng.choices(_WORDS, k=8)) + " \n" for _ in range(n)))
    return folder


def nanogpt_chars(folder: Path, n: int = 20000) -> Path:
    """nanoGPT's data/shakespeare_char layout: train.bin, val.bin (uint16 ids), meta.pkl."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(4)
    text = "\n".join(" ".join(rng.choices(_WORDS, k=6)) for _ in range(n // 30))[:n]  # "\n": sample.py's start
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    cut = int(len(ids) * 0.9)
    ids[:cut].tofile(os.path.join(folder, "train.bin"))
    ids[cut:].tofile(os.path.join(folder, "val.bin"))
    with open(folder / "meta.pkl", "wb") as fh:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, fh)
    return folder


def llmc_shard(path: Path, n: int = 4096, vocab: int = 50257) -> Path:
    """A token shard in llm.c's .bin format (dev/data/data_common.py): a header of 256 int32
    (magic 20240520, version 1, token count), then the tokens as uint16."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, n)
    tokens = np.random.default_rng(5).integers(0, vocab, n, dtype=np.uint16)
    path.write_bytes(header.tobytes() + tokens.tobytes())
    return path


def gpt_fast_checkpoint(folder: Path, repo: Path, config: str = "stories15M") -> Path:
    """gpt-fast's checkpoint layout, FOLDER/CONFIG/model.pth (generate.py picks the model config by the
    folder's name): the random weights of the checkout's own ``Transformer.from_name(CONFIG)``, built in a
    child interpreter (the checkout's ``model`` module stays out of this one), and a byte-level
    ``tokenizer.model`` in tiktoken's BPE-file format (one ``BASE64TOKEN RANK`` a line)."""
    import base64
    import subprocess
    import sys

    target = folder / config
    if (target / "model.pth").exists():
        return target / "model.pth"
    target.mkdir(parents=True, exist_ok=True)
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); from model import Transformer; torch.manual_seed(0); "
            "m = Transformer.from_name(sys.argv[2]).to(torch.bfloat16); torch.save(m.state_dict(), sys.argv[3])")
    subprocess.run([sys.executable, "-c", code, str(repo), config, str(target / "model.pth")], check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    (target / "tokenizer.model").write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n"
                                                    for b in range(256)))
    return target / "model.pth"
