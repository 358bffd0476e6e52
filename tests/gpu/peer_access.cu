// Peer access to memory cudalloc serves (scripts/gpu-test, 2 GPUs or more). cudaMalloc blocks
// on GPU 0 and GPU 1, small and large, made before peer access is enabled both ways, and more
// made after it (new chunks of expandable segments, and under page stitching pages moved from a
// freed block of another stream). For each pair: a kernel on GPU 1 reads GPU 0's block and
// writes GPU 1's, a kernel on GPU 0 reads GPU 1's and writes its own, then cudaMemcpyPeer each
// way. Expandable segments are virtual memory that a device can reach only once it has been
// granted access: without the grant the kernels fault.
//
// stdout: one line per pair with its wrong words, the same natively and under cudalloc.
// stderr, under cudalloc: "served by cudalloc: ..." with the live blocks per device and the pages
// moved; exit 1 if cudalloc holds fewer blocks than the program made. Exit 2: fewer than two
// GPUs, or GPU 0 and 1 cannot reach each other.
#define CUDALLOC_DYNAMIC
#include <cudalloc/cudalloc.h>

#include <vector>

#include "common.h"

namespace {

constexpr unsigned kMul = 2654435761u;

__global__ void derive(const unsigned* src, unsigned* dst, size_t n, unsigned salt) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i] * kMul + salt;
}

struct Pair {
  const char* what;
  size_t bytes;
  unsigned* on0 = nullptr;
  unsigned* on1 = nullptr;
};

unsigned* alloc_on(int dev, size_t bytes) {
  CHECK_CUDA(cudaSetDevice(dev));
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  return static_cast<unsigned*>(p);
}

void make(Pair& p) {
  p.on0 = alloc_on(0, p.bytes);
  p.on1 = alloc_on(1, p.bytes);
}

// A large block on GPU 0 made at the peak after a block of the legacy stream was freed in its
// order: under page stitching the growth takes that block's pages (a remap after the grant).
unsigned* alloc_after_free(std::vector<void*>& keep) {
  CHECK_CUDA(cudaSetDevice(0));
  void* gone = nullptr;
  void* kept = nullptr;
  CHECK_CUDA(cudaMallocAsync(&gone, 40 << 20, 0));
  CHECK_CUDA(cudaMallocAsync(&kept, 40 << 20, 0));
  CHECK_CUDA(cudaFreeAsync(gone, 0));
  CHECK_CUDA(cudaDeviceSynchronize());
  keep.push_back(kept);
  return alloc_on(0, 60 << 20);
}

size_t wrong(const std::vector<unsigned>& h, const std::vector<unsigned>& expected) {
  size_t bad = 0;
  for (size_t i = 0; i < h.size(); ++i) bad += h[i] != expected[i];
  return bad;
}

std::vector<unsigned> read(int dev, const unsigned* p, size_t n) {
  CHECK_CUDA(cudaSetDevice(dev));
  std::vector<unsigned> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  return h;
}

// The kernels each way and the peer copies each way; prints the wrong words of each.
void exercise(const Pair& p, unsigned seed) {
  const size_t n = p.bytes / sizeof(unsigned);
  CHECK_CUDA(cudaSetDevice(0));
  fill_pattern<<<256, 256>>>(p.on0, n, seed);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaSetDevice(1));
  derive<<<256, 256>>>(p.on0, p.on1, n, 1);  // GPU 1 reads GPU 0's block
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaSetDevice(0));
  derive<<<256, 256>>>(p.on1, p.on0, n, 2);  // GPU 0 reads GPU 1's block
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<unsigned> e1(n), e0(n);
  for (size_t i = 0; i < n; ++i) {
    e1[i] = (seed ^ unsigned(i)) * kMul + 1;
    e0[i] = e1[i] * kMul + 2;
  }
  const size_t kernel_bad = wrong(read(1, p.on1, n), e1) + wrong(read(0, p.on0, n), e0);
  CHECK_CUDA(cudaMemcpyPeer(p.on1, 1, p.on0, 0, p.bytes));
  size_t copy_bad = wrong(read(1, p.on1, n), e0);
  CHECK_CUDA(cudaSetDevice(1));
  fill_pattern<<<256, 256>>>(p.on1, n, seed + 7);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpyPeer(p.on0, 0, p.on1, 1, p.bytes));
  for (size_t i = 0; i < n; ++i) e0[i] = (seed + 7) ^ unsigned(i);
  copy_bad += wrong(read(0, p.on0, n), e0);
  std::printf("%s %zu bytes: kernels %zu wrong words, peer copies %zu wrong words\n", p.what, p.bytes, kernel_bad,
              copy_bad);
}

// Under cudalloc: whether it holds at least `blocks` live blocks of `bytes` on each GPU.
bool served(int blocks, size_t bytes) {
  bool ok = true;
  std::fprintf(stderr, "served by cudalloc:");
  for (int dev = 0; dev < 2; ++dev) {
    int64_t live = 0, held = 0, moved = 0;
    if (cudalloc_stat(dev, "allocation.all.current", &live) != CUDALLOC_OK ||
        cudalloc_stat(dev, "allocated_bytes.all.current", &held) != CUDALLOC_OK ||
        cudalloc_stat(dev, "num_remapped_pages", &moved) != CUDALLOC_OK) {
      std::fprintf(stderr, " device %d unknown\n", dev);
      return false;
    }
    std::fprintf(stderr, " device %d %lld live blocks, %lld bytes, %lld pages moved;", dev, (long long)live,
                 (long long)held, (long long)moved);
    ok = ok && live >= blocks && held >= static_cast<int64_t>(bytes);
  }
  std::fprintf(stderr, "\n");
  return ok;
}

}  // namespace

int main() {
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  int can10 = 0, can01 = 0;
  if (count >= 2) {
    CHECK_CUDA(cudaDeviceCanAccessPeer(&can10, 1, 0));
    CHECK_CUDA(cudaDeviceCanAccessPeer(&can01, 0, 1));
  }
  if (!can10 || !can01) {
    std::fprintf(stderr, "peer_access: needs GPUs 0 and 1 with peer access (%d GPUs)\n", count);
    return 2;
  }
  std::vector<Pair> pairs{{"before small", 64 << 10}, {"before large", 24 << 20}};
  for (Pair& p : pairs) make(p);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  pairs.push_back({"after small", 256 << 10});
  pairs.push_back({"after large", 48 << 20});
  for (size_t i = 2; i < pairs.size(); ++i) make(pairs[i]);
  std::vector<void*> keep;
  Pair moved{"after free", 60 << 20};
  moved.on0 = alloc_after_free(keep);
  moved.on1 = alloc_on(1, moved.bytes);
  pairs.push_back(moved);
  size_t bytes = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    exercise(pairs[i], 0x1000u * unsigned(i + 1));
    bytes += pairs[i].bytes;
  }
  int rc = 0;
  int64_t probe = 0;
  if (cudalloc_stat(0, "allocation.all.current", &probe) != CUDALLOC_ERROR_NOT_LOADED &&
      !served(static_cast<int>(pairs.size()), bytes)) {
    std::fprintf(stderr, "peer_access: cudalloc did not serve the blocks\n");
    rc = 1;
  }
  for (Pair& p : pairs) {
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(p.on0));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaFree(p.on1));
  }
  CHECK_CUDA(cudaSetDevice(0));
  for (void* k : keep) CHECK_CUDA(cudaFreeAsync(k, 0));
  CHECK_CUDA(cudaDeviceSynchronize());
  return rc;
}
