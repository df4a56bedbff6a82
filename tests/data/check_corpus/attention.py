import torch
import torch.nn.functional as F
from flash_attn import flash_attn_func  # expect: LIB001
import xformers.ops as xops  # expect: LIB002
from torch.nn.attention import SDPBackend, sdpa_kernel


def attend(q, k, v, causal=True):
    out = flash_attn_func(q, k, v, dropout_p=0.0, causal=causal)  # expect: LIB001
    out2 = xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask())  # expect: LIB002
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # expect: API018
        out3 = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False):  # expect: API016
        pass
    torch.backends.cuda.enable_flash_sdp(True)  # expect: API015
    return out + out2 + out3


def losses(pred, target, a, b):
    dot = torch.einsum("bn,bn->b", [pred, target])  # expect: EIN001
    att = torch.einsum("bhqd,bhkd->bhqk", a, b)  # expect: EIN001
    odd = torch.einsum("ijk,jil->kl", a, b)  # expect: EIN001
    return dot, att, odd
