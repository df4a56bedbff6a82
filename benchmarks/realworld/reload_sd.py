"""The acceptance run's reload check: the pipeline train_text_to_image.py saved loads and samples.

Written as CUDA users write it (``.to("cuda")``, float16 autocast) and run under
``torch-adapter run``: ``python -m torch_adapter run reload_sd.py OUTPUT_DIR``.
"""

import sys

import numpy as np
import torch
from diffusers import StableDiffusionPipeline

pipe = StableDiffusionPipeline.from_pretrained(sys.argv[1], safety_checker=None).to("cuda")
generator = torch.Generator("cuda").manual_seed(0)
with torch.autocast("cuda", dtype=torch.float16):
    images = pipe("red circle", num_inference_steps=2, height=16, width=16, output_type="np",
                  generator=generator).images
assert images.shape == (1, 16, 16, 3) and np.isfinite(images).all(), (images.shape, images.dtype)
print("reloaded ok", images.shape)
