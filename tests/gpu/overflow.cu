// Planted out-of-bounds writes: one element past a 1000-float allocation that sits inside a
// cached segment, and one past a 1000-float allocation served from a freed 1024-float block
// (inside the block's rounded size: only a registration with the new requested size catches
// it). memcheck stops the program at the first invalid write (the kernel fails), so each run
// plants one of them:
//   overflow [first]  the write past the first block
//   overflow reuse    the write past the block served again
//   overflow clean    the same allocations and kernels, every write in bounds (0 errors)
#include <cstring>

#include "common.h"

__global__ void write_n(float* p, int n, int past) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n + past) p[i] = 1.0f;  // past == 1: i == n is out of bounds
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "first";
  const int past_first = std::strcmp(mode, "first") == 0 ? 1 : 0;
  const int past_reuse = std::strcmp(mode, "reuse") == 0 ? 1 : 0;
  float *keep, *victim;
  CHECK_CUDA(cudaMalloc(&keep, 4096));       // so the victim is not at a segment start
  CHECK_CUDA(cudaMalloc(&victim, 1000 * sizeof(float)));
  float* after;
  CHECK_CUDA(cudaMalloc(&after, 4096));      // a neighbour the overflow would land in
  write_n<<<4, 256>>>(victim, 1000, past_first);
  CHECK_CUDA(cudaDeviceSynchronize());

  // A stream-ordered free on the same stream is reusable at once: under cudalloc the next
  // request of the same rounded size gets the same block back.
  float *first, *again;
  CHECK_CUDA(cudaMallocAsync(&first, 1024 * sizeof(float), 0));
  write_n<<<4, 256>>>(first, 1024, 0);
  CHECK_CUDA(cudaFreeAsync(first, 0));
  CHECK_CUDA(cudaMallocAsync(&again, 1000 * sizeof(float), 0));
  write_n<<<4, 256>>>(again, 1000, past_reuse);
  CHECK_CUDA(cudaStreamSynchronize(0));
  std::printf("overflow kernels ran; second block %s\n", again == first ? "reused" : "new");

  CHECK_CUDA(cudaFreeAsync(again, 0));
  CHECK_CUDA(cudaFree(victim));
  CHECK_CUDA(cudaFree(after));
  CHECK_CUDA(cudaFree(keep));
  CHECK_CUDA(cudaDeviceSynchronize());
  return 0;
}
