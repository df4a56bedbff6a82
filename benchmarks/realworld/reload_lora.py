"""The acceptance run's LoRA check: the weights train_dreambooth_lora.py saved load into the base
pipeline and sample.

Written as CUDA users write it (``torch_dtype=torch.float16``, ``.to("cuda")``, a CUDA generator) and
run under ``torch-adapter run``: ``python -m torch_adapter run reload_lora.py BASE_DIR LORA_DIR``.
"""

import sys

import numpy as np
import torch
from diffusers import StableDiffusionPipeline

pipe = StableDiffusionPipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float16, safety_checker=None).to("cuda")
def projections():  # every attention query projection's weight (the base layer's, once LoRA wraps it)
    return {name: getattr(m, "base_layer", m).weight.detach().clone()
            for name, m in pipe.unet.named_modules() if name.endswith("to_q")}


before = projections()
pipe.load_lora_weights(sys.argv[2], weight_name="pytorch_lora_weights.safetensors")
pipe.fuse_lora()
after = projections()
changed = sum(not torch.equal(before[k], after[k]) for k in before)
assert changed > 0, "fusing the LoRA weights changed no attention projection"
images = pipe("a photo of sks dog", num_inference_steps=2, height=32, width=32, output_type="np",
              generator=torch.Generator("cuda").manual_seed(0)).images
assert images.shape == (1, 32, 32, 3) and np.isfinite(images).all(), (images.shape, images.dtype)
print("lora reloaded ok", images.shape, "projections changed:", changed)
