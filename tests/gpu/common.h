// Shared helpers for the GPU test programs (built by scripts/gpu-build with nvcc).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

#define CHECK_CUDA(call)                                                                     \
  do {                                                                                       \
    cudaError_t err_ = (call);                                                               \
    if (err_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(3);                                                                          \
    }                                                                                        \
  } while (0)

// The same for a driver call.
#define CHECK_CU(call)                                                                        \
  do {                                                                                        \
    CUresult r_ = (call);                                                                     \
    if (r_ != CUDA_SUCCESS) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s -> error %d\n", __FILE__, __LINE__, #call, static_cast<int>(r_)); \
      std::exit(3);                                                                           \
    }                                                                                         \
  } while (0)

// A green context over all of `dev`'s SMs, with its own default stream.
inline CUgreenCtx make_green_context(CUdevice dev) {
  CUdevResource sms{};
  CHECK_CU(cuDeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM));
  CUdevResourceDesc desc{};
  CHECK_CU(cuDevResourceGenerateDesc(&desc, &sms, 1));
  CUgreenCtx green = nullptr;
  CHECK_CU(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  return green;
}

// Spins on the device for about `ns` nanoseconds so that later work is still queued.
__device__ inline void spin_ns(unsigned long long ns) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) break;
  }
}

// A word pattern that depends on the value and the index, written and then checked: a block
// whose bytes moved or were overwritten counts its wrong words in `bad`.
__global__ void fill_pattern(unsigned* p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v ^ unsigned(i);
}
__global__ void check_pattern(const unsigned* p, size_t n, unsigned v, unsigned long long* bad) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (p[i] != (v ^ unsigned(i))) atomicAdd(bad, 1ull);
}
