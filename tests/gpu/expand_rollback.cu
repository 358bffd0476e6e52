// Rollback of a failed expansion on the real driver: run with CUDALLOC_CONF=expandable_segments:true.
// The program takes nearly all device memory for itself from a memory pool of its own (which
// cudalloc passes through), so that the next growth of cudalloc's expandable segment fails inside cuMemCreate.
// cudaMalloc must then report out of memory, leave the blocks already handed out intact, keep
// serving requests that still fit, and grow again once the memory is back.
#include <vector>
#include "common.h"

int main() {
  const size_t mib = size_t{1} << 20;
  unsigned long long* bad;
  CHECK_CUDA(cudaMalloc(&bad, sizeof *bad));
  CHECK_CUDA(cudaMemset(bad, 0, sizeof *bad));
  unsigned* kept;
  CHECK_CUDA(cudaMalloc(&kept, 256 * mib));
  fill_pattern<<<256, 256>>>(kept, 256 * mib / 4, 11);
  CHECK_CUDA(cudaDeviceSynchronize());

  // Take the device's memory from a pool of the program's own (cudaMallocFromPoolAsync goes to
  // the driver untouched; unmapped cuMemCreate handles do not hold memory back):
  // 1 GiB pieces, then 64 MiB pieces, until the driver says no.
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool;
  CHECK_CUDA(cudaMemPoolCreate(&pool, &props));
  unsigned long long keep_all = ~0ull;
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  std::vector<void*> hog;
  size_t taken = 0;
  cudaError_t last = cudaSuccess;
  for (size_t piece : {1024 * mib, 64 * mib}) {
    for (;;) {
      void* h = nullptr;
      if ((last = cudaMallocFromPoolAsync(&h, piece, pool, 0)) != cudaSuccess) break;
      CHECK_CUDA(cudaStreamSynchronize(0));
      hog.push_back(h);
      taken += piece;
    }
    cudaGetLastError();
  }
  size_t free_now = 0, total = 0;
  cudaMemGetInfo(&free_now, &total);
  std::printf("took %zu MiB in %zu pieces (last: %s); %zu MiB free of %zu\n", taken / mib, hog.size(),
              cudaGetErrorString(last), free_now / mib, total / mib);
  if (taken < total / 2) {
    std::fprintf(stderr, "could not take the device's memory\n");
    return 1;
  }
  // Give two pieces back (at most 2 GiB): enough for a small growth, not for an 8 GiB one.
  for (int i = 0; i < 2 && !hog.empty(); ++i) {
    CHECK_CUDA(cudaFreeAsync(hog.back(), 0));
    hog.pop_back();
  }
  CHECK_CUDA(cudaStreamSynchronize(0));
  CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
  void* big = nullptr;
  const cudaError_t e = cudaMalloc(&big, 8192 * mib);
  cudaGetLastError();
  if (e != cudaErrorMemoryAllocation) {
    std::fprintf(stderr, "growth past the free memory gave %s, expected out of memory\n", cudaGetErrorString(e));
    return 1;
  }
  unsigned* small;
  CHECK_CUDA(cudaMalloc(&small, 32 * mib));  // still fits: the failed growth left nothing mapped
  fill_pattern<<<256, 256>>>(small, 32 * mib / 4, 22);
  check_pattern<<<256, 256>>>(small, 32 * mib / 4, 22, bad);
  check_pattern<<<256, 256>>>(kept, 256 * mib / 4, 11, bad);
  CHECK_CUDA(cudaDeviceSynchronize());

  for (void* h : hog) CHECK_CUDA(cudaFreeAsync(h, 0));
  hog.clear();
  CHECK_CUDA(cudaStreamSynchronize(0));
  CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
  CHECK_CUDA(cudaMalloc(&big, 8192 * mib));  // grows again once memory is back
  fill_pattern<<<1024, 256>>>(static_cast<unsigned*>(big), 8192 * mib / 4, 33);
  check_pattern<<<1024, 256>>>(static_cast<unsigned*>(big), 8192 * mib / 4, 33, bad);
  check_pattern<<<256, 256>>>(kept, 256 * mib / 4, 11, bad);
  unsigned long long nbad = 0;
  CHECK_CUDA(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
  if (nbad != 0) {
    std::fprintf(stderr, "%llu words wrong\n", nbad);
    return 1;
  }
  CHECK_CUDA(cudaFree(big));
  CHECK_CUDA(cudaFree(small));
  CHECK_CUDA(cudaFree(kept));
  std::printf("failed growth reported out of memory, contents intact, growth works again\n");
  return 0;
}
