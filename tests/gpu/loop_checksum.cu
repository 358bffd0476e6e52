// A legacy-style program that allocates in loops on every kind of stream and prints a
// checksum of what it computed. Built with the static runtime, the shared runtime and
// --default-stream per-thread; the output must not change under cudalloc.
#include <cstdint>
#include <vector>
#include "common.h"

__global__ void fill(std::uint32_t* p, int n, std::uint32_t seed) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = seed * 2654435761u + static_cast<std::uint32_t>(i) * 40503u;
}
__global__ void mix(std::uint32_t* out, const std::uint32_t* a, const std::uint32_t* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (a[i] ^ (b[i] >> 3)) + out[i] * 7u;
}

int main() {
  cudaStream_t nb, blocking;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreate(&blocking));
  std::uint64_t checksum = 0;
  long allocations = 0;
  for (int round = 0; round < 200; ++round) {
    const int n = 257 + (round * 7919) % 300000;
    std::uint32_t *a, *b, *c;
    CHECK_CUDA(cudaMalloc(&a, n * sizeof(std::uint32_t)));
    CHECK_CUDA(cudaMalloc(&b, n * sizeof(std::uint32_t)));
    CHECK_CUDA(cudaMallocAsync(&c, n * sizeof(std::uint32_t), nb));
    allocations += 3;
    cudaStream_t s = (round % 3 == 0) ? nb : (round % 3 == 1 ? blocking : cudaStream_t{0});
    fill<<<(n + 255) / 256, 256, 0, s>>>(a, n, round);
    fill<<<(n + 255) / 256, 256, 0, s>>>(b, n, round + 1000);
    CHECK_CUDA(cudaMemsetAsync(c, 0, n * sizeof(std::uint32_t), s));
    mix<<<(n + 255) / 256, 256, 0, s>>>(c, a, b, n);
    std::vector<std::uint32_t> h(n);
    CHECK_CUDA(cudaMemcpyAsync(h.data(), c, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaFree(a));               // cudaFree of a cudaMalloc pointer
    CHECK_CUDA(cudaFreeAsync(b, nb));       // cudaFreeAsync of a cudaMalloc pointer
    if (round % 2) CHECK_CUDA(cudaFree(c)); // cudaFree of a cudaMallocAsync pointer
    else CHECK_CUDA(cudaFreeAsync(c, s));
    for (int i = 0; i < n; i += 97) checksum = checksum * 1099511628211ull + h[i];
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("allocations=%ld checksum=%016llx\n", allocations, static_cast<unsigned long long>(checksum));
  return 0;
}
