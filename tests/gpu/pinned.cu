// Pinned host memory on the real driver: blocks from cudaHostAlloc / cudaMallocHost carry data
// to and from the device through asynchronous copies and mapped (zero-copy) access, are freed
// while those copies may still be queued, and are allocated again at once. Every round checks
// what came back. Prints one line of totals; the same output natively and under cudalloc
// (scripts/gpu-test compares them and reads cudalloc's host statistics).
//
// Built by scripts/gpu-build:  build_one pinned "$root/tests/gpu/pinned.cu"
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace {

__global__ void add_one(unsigned* p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] += 1;
}

}  // namespace

int main() {
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t sizes[] = {4096, 100000, 1 << 20, 3 << 20, 16 << 20};
  unsigned long long bad = 0, rounds = 0;
  unsigned* dev = nullptr;
  CHECK_CUDA(cudaMalloc(&dev, 16 << 20));
  for (int round = 0; round < 200; ++round) {
    const size_t bytes = sizes[round % 5];
    const size_t n = bytes / sizeof(unsigned);
    unsigned* in = nullptr;
    unsigned* out = nullptr;
    const unsigned flags = round % 3 == 0 ? cudaHostAllocPortable : cudaHostAllocDefault;
    CHECK_CUDA(cudaHostAlloc(&in, bytes, flags));
    CHECK_CUDA(cudaMallocHost(&out, bytes));
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<unsigned>(round * 7919 + i);
    CHECK_CUDA(cudaMemcpyAsync(dev, in, bytes, cudaMemcpyHostToDevice, s));
    add_one<<<64, 256, 0, s>>>(dev, n);
    CHECK_CUDA(cudaMemcpyAsync(out, dev, bytes, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; ++i) bad += out[i] != static_cast<unsigned>(round * 7919 + i + 1);
    // Freed with a copy into it still queued: the block must not come back before the copy ran.
    add_one<<<64, 256, 0, s>>>(dev, n);
    CHECK_CUDA(cudaMemcpyAsync(out, dev, bytes, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaFreeHost(in));
    CHECK_CUDA(cudaFreeHost(out));
    unsigned* again = nullptr;
    CHECK_CUDA(cudaMallocHost(&again, bytes));
    std::memset(again, 0xab, bytes);
    CHECK_CUDA(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; ++i) bad += again[i] != 0xababababu;
    CHECK_CUDA(cudaFreeHost(again));
    ++rounds;
  }
  // Mapped memory: a kernel writes the host block through its device pointer.
  unsigned* mapped = nullptr;
  CHECK_CUDA(cudaHostAlloc(&mapped, 1 << 20, cudaHostAllocMapped));
  std::memset(mapped, 0, 1 << 20);
  unsigned* mapped_dev = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mapped_dev), mapped, 0));
  add_one<<<64, 256, 0, s>>>(mapped_dev, (1 << 20) / sizeof(unsigned));
  CHECK_CUDA(cudaStreamSynchronize(s));
  for (size_t i = 0; i < (1 << 20) / sizeof(unsigned); ++i) bad += mapped[i] != 1u;
  unsigned got_flags = 0;
  CHECK_CUDA(cudaHostGetFlags(&got_flags, mapped));
  CHECK_CUDA(cudaFreeHost(mapped));
  CHECK_CUDA(cudaFree(dev));
  std::printf("pinned: rounds=%llu bad=%llu mapped_flag=%d\n", rounds, bad, (got_flags & cudaHostAllocMapped) != 0);
  return bad == 0 ? 0 : 1;
}
