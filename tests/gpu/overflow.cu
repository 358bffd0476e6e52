// A planted out-of-bounds write: one element past a 1000-float allocation that sits inside a
// cached segment. compute-sanitizer memcheck must report it under cudalloc too.
#include "common.h"

__global__ void write_n_plus_one(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) p[i] = 1.0f;  // i == n is out of bounds
}

int main() {
  float *keep, *victim;
  CHECK_CUDA(cudaMalloc(&keep, 4096));       // so the victim is not at a segment start
  CHECK_CUDA(cudaMalloc(&victim, 1000 * sizeof(float)));
  float* after;
  CHECK_CUDA(cudaMalloc(&after, 4096));      // a neighbour the overflow would land in
  write_n_plus_one<<<4, 256>>>(victim, 1000);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("overflow kernel ran\n");
  CHECK_CUDA(cudaFree(victim));
  CHECK_CUDA(cudaFree(after));
  CHECK_CUDA(cudaFree(keep));
  return 0;
}
