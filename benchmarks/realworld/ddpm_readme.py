"""denoising-diffusion-pytorch's README usage ("Or, if you simply want to pass in a folder…"), as a file.

The README's snippet with its sizes shrunk (dim, image_size, steps) and FID off (it needs
Inception weights from the network), and seeded; everything else as written, including
``flash_attn = True`` and ``amp = True``. Run as ``torch-adapter run ddpm_readme.py IMAGES``.
"""

import sys

import torch

from denoising_diffusion_pytorch import GaussianDiffusion, Trainer, Unet

torch.manual_seed(0)  # not in the README: seeded so that two targets' losses compare (run.py --compare-cpu)

model = Unet(
    dim = 8,
    dim_mults = (1, 2),
    flash_attn = True
)

diffusion = GaussianDiffusion(
    model,
    image_size = 16,
    timesteps = 10,           # number of steps
    sampling_timesteps = 2    # number of sampling timesteps (using ddim for faster inference [see citation for ddim paper])
)

trainer = Trainer(
    diffusion,
    sys.argv[1],
    train_batch_size = 8,
    train_lr = 8e-5,
    train_num_steps = 2,              # total training steps
    gradient_accumulate_every = 2,    # gradient accumulation steps
    ema_decay = 0.995,                # exponential moving average decay
    amp = True,                       # turn on mixed precision
    calculate_fid = False,            # whether to calculate fid during training
    save_and_sample_every = 2,
    num_samples = 4,
)

trainer.train()
print("training complete")
