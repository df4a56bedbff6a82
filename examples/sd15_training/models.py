"""Stable Diffusion v1.5 model configs, model construction and the einsum attention processor.

Two configs:

* ``full``: the real SD v1.5 architecture (runwayml/stable-diffusion-v1-5): UNet with
  block_out_channels (320, 640, 1280, 1280) and cross_attention_dim 768, the CLIP
  ViT-L/14 text encoder (hidden 768, 12 layers, 12 heads), the KL VAE with
  (128, 256, 512, 512), 512 px images. About 860M UNet parameters: a GPU config.
* ``tiny``: the same block layout (CrossAttnDownBlock2D x3 + DownBlock2D, the mirrored up
  path, a cross-attention mid block, an 8x VAE), scaled down so a few steps run in
  seconds on a CPU.

Weights are random: nothing is downloaded. Swap ``build_models`` for
``from_pretrained(...)`` calls to fine-tune real SD v1.5 weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
from diffusers.models.attention_processor import Attention
from transformers import CLIPTextConfig, CLIPTextModel


@dataclass(frozen=True)
class SDConfig:
    resolution: int
    unet: dict = field(default_factory=dict)
    vae: dict = field(default_factory=dict)
    text_encoder: dict = field(default_factory=dict)


SD15_UNET_BLOCKS = dict(
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    mid_block_type="UNetMidBlock2DCrossAttn",
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
)
SD15_VAE_BLOCKS = dict(
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
)

CONFIGS: dict[str, SDConfig] = {
    # The published SD v1.5 configs (unet/config.json, vae/config.json, text_encoder/config.json).
    "full": SDConfig(
        resolution=512,
        unet=dict(
            **SD15_UNET_BLOCKS,
            in_channels=4, out_channels=4, sample_size=64,
            block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
            cross_attention_dim=768, attention_head_dim=8,
            norm_num_groups=32, norm_eps=1e-5, act_fn="silu",
            flip_sin_to_cos=True, freq_shift=0, downsample_padding=1,
        ),
        vae=dict(
            **SD15_VAE_BLOCKS,
            in_channels=3, out_channels=3, latent_channels=4, sample_size=512,
            block_out_channels=(128, 256, 512, 512), layers_per_block=2,
            norm_num_groups=32, act_fn="silu", scaling_factor=0.18215,
        ),
        text_encoder=dict(  # CLIP ViT-L/14 text tower
            vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768,
            num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
            hidden_act="quick_gelu", layer_norm_eps=1e-5,
        ),
    ),
    # Same layout, small widths: 2 training steps take seconds on 2 CPU cores.
    "tiny": SDConfig(
        resolution=64,
        unet=dict(
            **SD15_UNET_BLOCKS,
            in_channels=4, out_channels=4, sample_size=8,
            block_out_channels=(32, 64, 64, 64), layers_per_block=1,
            cross_attention_dim=64, attention_head_dim=4,
            norm_num_groups=32, norm_eps=1e-5, act_fn="silu",
            flip_sin_to_cos=True, freq_shift=0, downsample_padding=1,
        ),
        vae=dict(
            **SD15_VAE_BLOCKS,
            in_channels=3, out_channels=3, latent_channels=4, sample_size=64,
            block_out_channels=(16, 32, 64, 64), layers_per_block=1,
            norm_num_groups=8, act_fn="silu", scaling_factor=0.18215,
        ),
        text_encoder=dict(
            vocab_size=1000, hidden_size=64, intermediate_size=128, projection_dim=64,
            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
            hidden_act="quick_gelu", layer_norm_eps=1e-5,
        ),
    ),
}


def build_noise_scheduler() -> DDPMScheduler:
    """The SD v1.5 training noise schedule (scheduler/scheduler_config.json)."""
    return DDPMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        prediction_type="epsilon",
        steps_offset=1,
    )


def build_models(config: SDConfig, tokenizer, resolution: int):
    """Text encoder, VAE and UNet with random weights from ``config``.

    The text encoder's vocabulary is sized to cover ``tokenizer`` and its special-token
    ids are taken from it, so the locally built tokenizer and the model agree.
    """
    te_kwargs = dict(config.text_encoder)
    te_kwargs["vocab_size"] = max(te_kwargs["vocab_size"], len(tokenizer))
    text_config = CLIPTextConfig(
        **te_kwargs,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    text_encoder = CLIPTextModel(text_config)

    vae = AutoencoderKL(**{**config.vae, "sample_size": resolution})
    vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)
    unet_kwargs = dict(config.unet)
    unet_kwargs["sample_size"] = resolution // vae_scale_factor
    unet_kwargs["cross_attention_dim"] = text_config.hidden_size
    unet = UNet2DConditionModel(**unet_kwargs)
    return text_encoder, vae, unet


class EinsumAttnProcessor:
    """Scaled dot-product attention written with ``torch.einsum``, as many training repos do.

    A drop-in for diffusers' ``AttnProcessor``: ``unet.set_attn_processor(EinsumAttnProcessor())``.
    Handles self- and cross-attention, 4D (B, C, H, W) inputs, masks, ``upcast_attention``
    and ``upcast_softmax``.
    """

    def __call__(self, attn: Attention, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 temb: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)

        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch, channels, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channels, height * width).transpose(1, 2)

        batch, seq_len, _ = hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        attention_mask = attn.prepare_attention_mask(attention_mask, seq_len, batch)

        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)

        # (batch, seq, heads * dim) -> (batch * heads, seq, dim)
        query = attn.head_to_batch_dim(query)
        key = attn.head_to_batch_dim(key)
        value = attn.head_to_batch_dim(value)

        if attn.upcast_attention:
            query, key = query.float(), key.float()
        scores = torch.einsum("b i d, b j d -> b i j", query, key) * attn.scale
        if attention_mask is not None:
            scores = scores + attention_mask
        if attn.upcast_softmax:
            scores = scores.float()
        probs = scores.softmax(dim=-1).to(value.dtype)

        hidden_states = torch.einsum("b i j, b j d -> b i d", probs, value)
        hidden_states = attn.batch_to_head_dim(hidden_states)

        hidden_states = attn.to_out[0](hidden_states)  # linear projection
        hidden_states = attn.to_out[1](hidden_states)  # dropout

        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channels, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


def count_parameters(module: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
