"""The acceptance run's ControlNet check: the ControlNet train_controlnet.py saved drives the base
pipeline.

Written as CUDA users write it (``torch_dtype=torch.float16``, ``.to("cuda")``, a CUDA generator) and
run under ``torch-adapter run``: ``python -m torch_adapter run reload_controlnet.py BASE_DIR CONTROLNET_DIR
CONDITIONING_IMAGE``.
"""

import sys

import numpy as np
import torch
from diffusers import ControlNetModel, StableDiffusionControlNetPipeline
from PIL import Image

controlnet = ControlNetModel.from_pretrained(sys.argv[2], torch_dtype=torch.float16)
pipe = StableDiffusionControlNetPipeline.from_pretrained(sys.argv[1], controlnet=controlnet, torch_dtype=torch.float16,
                                                         safety_checker=None).to("cuda")
images = pipe("red circle", image=Image.open(sys.argv[3]).convert("RGB"), num_inference_steps=2, height=64, width=64,
              output_type="np", generator=torch.Generator("cuda").manual_seed(0)).images
assert images.shape == (1, 64, 64, 3) and np.isfinite(images).all(), (images.shape, images.dtype)
print("controlnet reloaded ok", images.shape)
