// Reuse-after-free race: work still queued on a NON-BLOCKING stream writes into a block that
// the program has already freed. The next owner of that memory must never see those writes.
#include <cstdint>
#include <vector>
#include "common.h"

__global__ void late_write(unsigned char* p, int n, unsigned long long delay_ns) {
  if (threadIdx.x == 0 && blockIdx.x == 0) spin_ns(delay_ns);
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 0xAA;
}

int main() {
  const int n = 1 << 20;
  cudaStream_t nb;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  int corrupted_rounds = 0, same_address = 0;
  for (int round = 0; round < 20; ++round) {
    unsigned char* a;
    CHECK_CUDA(cudaMalloc(&a, n));
    late_write<<<1, 256, 0, nb>>>(a, n, 20ull * 1000 * 1000);  // writes after ~20 ms
    CHECK_CUDA(cudaFree(a));  // natively this waits for the kernel; a cache must not hand `a` out early
    unsigned char* b;
    CHECK_CUDA(cudaMalloc(&b, n));
    same_address += (a == b);
    CHECK_CUDA(cudaMemset(b, 0x55, n));  // legacy stream: does not wait for `nb`
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<unsigned char> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), b, n, cudaMemcpyDeviceToHost));
    for (unsigned char v : h) {
      if (v != 0x55) {
        ++corrupted_rounds;
        break;
      }
    }
    CHECK_CUDA(cudaFree(b));
  }
  std::printf("race: corrupted_rounds=%d same_address=%d\n", corrupted_rounds, same_address);
  return corrupted_rounds == 0 ? 0 : 1;
}
