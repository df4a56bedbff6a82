from torch.utils.cpp_extension import load_inline

kernel_src = r"""
__global__ void scale(float* x, float s, int n) {  // expect: SRC002
  int i = blockIdx.x * blockDim.x + threadIdx.x;  // expect: SRC002
  if (i < n) x[i] *= s;
}
"""

module = load_inline(
    name="scale",
    cpp_sources="void launch(torch::Tensor x, float s);",
    cuda_sources=kernel_src,  # expect: EXT002
    functions=["launch"],
    extra_cuda_cflags=["-O2"],  # expect: EXT002
)
