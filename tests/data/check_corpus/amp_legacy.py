import torch
from torch.cuda.amp import autocast, GradScaler  # expect: AMP004
from torch.cuda import amp as cuda_amp  # expect: AMP004
from apex import amp  # expect: LIB003
from apex.optimizers import FusedAdam  # expect: LIB004
from apex.normalization import FusedLayerNorm  # expect: LIB005


class Scale(torch.autograd.Function):
    @staticmethod
    @torch.cuda.amp.custom_fwd(cast_inputs=torch.float16)  # expect: AMP003
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @torch.cuda.amp.custom_bwd  # expect: AMP003
    def backward(ctx, g):
        return g * 2


def train(model, data):
    norm = FusedLayerNorm(16, eps=1e-5)  # expect: LIB005
    opt = FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)  # expect: LIB004
    model, opt = amp.initialize(model, opt, opt_level="O1")  # expect: LIB003
    scaler = GradScaler()  # expect: AMP002
    legacy = torch.cuda.amp.GradScaler(init_scale=2.0**16)  # expect: AMP002
    for x in data:
        with autocast():  # expect: AMP001
            out = model(norm(x))
        with cuda_amp.autocast(dtype=torch.bfloat16):  # expect: AMP001
            out = out + 1
        with amp.scale_loss(out.sum(), opt) as scaled:  # expect: LIB003
            scaled.backward()
        scaler.step(opt)  # expect: AMP007
        legacy.update()  # expect: AMP007
