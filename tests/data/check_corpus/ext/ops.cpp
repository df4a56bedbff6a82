#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>  // expect: SRC004

torch::Tensor fused_add(torch::Tensor x, torch::Tensor y);

torch::Tensor add(torch::Tensor x, torch::Tensor y) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");  // expect: SRC005
  auto stream = at::cuda::getCurrentCUDAStream();  // expect: SRC004
  return fused_add(x, y);
}

TORCH_LIBRARY(fused, m) { m.def("add(Tensor x, Tensor y) -> Tensor"); }
TORCH_LIBRARY_IMPL(fused, CUDA, m) { m.impl("add", &add); }  // expect: SRC003
/* a block comment about cuda
   spanning lines */
TORCH_LIBRARY_IMPL(fused, CPU, m) { m.impl("add", &add); }
