import torch
import triton  # expect: LIB011
import triton.language as tl  # expect: LIB011


@triton.jit  # expect: LIB011
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # expect: LIB011
    pid = tl.program_id(axis=0)  # expect: LIB011
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # expect: LIB011
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)  # expect: LIB011
    y = tl.load(y_ptr + offs, mask=mask)  # expect: LIB011
    tl.store(out_ptr + offs, x + y, mask=mask)  # expect: LIB011


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = out.numel()
    grid = (triton.cdiv(n, 1024),)  # expect: LIB011
    add_kernel[grid](x, y, out, n, BLOCK=1024)  # expect: LIB011
    return out
