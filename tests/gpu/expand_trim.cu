// Expandable segments on the real driver under a memory limit: run with
// CUDALLOC_CONF=expandable_segments:true,memory_limit_mb:1024. Fills the limit, frees, then
// asks for a block that only fits once free chunks are unmapped (trimming), checks contents,
// then asks past the limit (out of memory) and keeps working. Last, with everything freed, the
// program asks for a trim itself (cudaMemPoolTrimTo on the device's default pool): scripts/gpu-test
// finds the cache_release record in the trace, after which at most 64 MiB stay reserved.
#include <vector>
#include "common.h"

int main() {
  const size_t mib = size_t{1} << 20;
  unsigned long long* bad;
  CHECK_CUDA(cudaMalloc(&bad, sizeof *bad));
  CHECK_CUDA(cudaMemset(bad, 0, sizeof *bad));
  std::vector<unsigned*> blocks;
  for (int i = 0; i < 12; ++i) {  // 768 MiB in 64 MiB blocks, interleaved with small ones
    unsigned* p;
    CHECK_CUDA(cudaMalloc(&p, 64 * mib));
    fill_pattern<<<256, 256>>>(p, 64 * mib / 4, i);
    blocks.push_back(p);
  }
  unsigned* keep = blocks[5];  // stays live in the middle
  for (int i = 0; i < 12; ++i) if (i != 5) CHECK_CUDA(cudaFree(blocks[i]));
  unsigned* big;
  CHECK_CUDA(cudaMalloc(&big, 900 * mib));  // fits only once free chunks go back
  fill_pattern<<<1024, 256>>>(big, 900 * mib / 4, 77);
  check_pattern<<<1024, 256>>>(big, 900 * mib / 4, 77, bad);
  check_pattern<<<256, 256>>>(keep, 64 * mib / 4, 5, bad);
  CHECK_CUDA(cudaDeviceSynchronize());
  void* huge = nullptr;
  const cudaError_t past = cudaMalloc(&huge, 2048 * mib);  // past the limit
  cudaGetLastError();
  unsigned* after;
  CHECK_CUDA(cudaFree(big));
  CHECK_CUDA(cudaMalloc(&after, 128 * mib));  // still serving
  fill_pattern<<<256, 256>>>(after, 128 * mib / 4, 9);
  check_pattern<<<256, 256>>>(after, 128 * mib / 4, 9, bad);
  check_pattern<<<256, 256>>>(keep, 64 * mib / 4, 5, bad);
  unsigned long long h = 0;
  CHECK_CUDA(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(after));
  CHECK_CUDA(cudaFree(keep));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  CHECK_CUDA(cudaMemPoolTrimTo(pool, 64 * mib));
  std::printf("expand_trim: bad=%llu past_limit=%s\n", h, past == cudaErrorMemoryAllocation ? "oom" : cudaGetErrorName(past));
  return h == 0 && past == cudaErrorMemoryAllocation ? 0 : 1;
}
