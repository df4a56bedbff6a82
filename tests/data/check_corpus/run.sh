#!/usr/bin/env bash
# Launch on 2 GPUs (comment mentioning cuda: not a finding)
export CUDA_VISIBLE_DEVICES=0,1  # expect: TXT001
export NCCL_DEBUG=INFO  # expect: TXT004
nvidia-smi  # expect: ENV005
pip install flash-attn --no-build-isolation  # expect: TXT002
torchrun --nproc_per_node=2 train_ddp.py --backend nccl  # expect: ANY004
