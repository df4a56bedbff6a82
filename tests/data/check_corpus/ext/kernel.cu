// Fused add kernel; this line carries the file-level finding.  expect: SRC001
#include <cuda_runtime.h>  // expect: SRC004
#include <torch/extension.h>

__global__ void add_kernel(const float* x, const float* y, float* out, int n) {  // expect: SRC002
  int i = blockIdx.x * blockDim.x + threadIdx.x;  // expect: SRC002
  if (i < n) out[i] = x[i] + y[i];
}

torch::Tensor fused_add(torch::Tensor x, torch::Tensor y) {
  auto out = torch::empty_like(x);
  int n = x.numel();
  add_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);  // expect: SRC002
  cudaError_t err = cudaGetLastError();  // expect: SRC004
  return out;
}
