"""A portable script: nothing here is CUDA-specific (uses the word cuda only in text)."""
import torch


def step(model, x, device):
    # move to the accelerator chosen by the caller (cuda or not)
    x = x.to(device)
    return model(x).sum()
