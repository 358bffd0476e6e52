// A cached allocate+free pair through the preloaded shim, without a GPU: the program looks the
// fake driver (tests/fake_driver) up as the CUDA runtime does and calls what it got, so the
// figures cover the shim and the core but not the runtime or a real driver. For profiling on a
// machine without a GPU (one command line):
//   LD_PRELOAD=build/shim/libcudalloc.so LD_LIBRARY_PATH=build/tests/fake_driver
//   FAKE_CUDA_LOOKUP_TSV=tests/fake_driver/cudart13-driver-lookups.tsv build/bench/shim_pairs
// --threads T: T threads, each on a non-blocking stream of its own (as bench/pairs.cu's), run
// --iters cudaMalloc-path pairs of 64 KiB (or --size) at once; prints the pairs per second.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "client.h"

using Clock = std::chrono::steady_clock;
static const char* g_only = nullptr;

static void pairs(const char* name, std::size_t size, CUstream stream, bool async, int iters) {
  if (g_only && std::strcmp(g_only, name)) return;
  auto& c = client::client();
  constexpr int kWindow = 8;
  auto pair = [&] {
    CUdeviceptr p = 0;
    if (async) {
      CHECK_OR_DIE(c.api.cuMemAllocAsync(&p, size, stream) == CUDA_SUCCESS);
      CHECK_OR_DIE(c.api.cuMemFreeAsync(p, stream) == CUDA_SUCCESS);
    } else {
      CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, size) == CUDA_SUCCESS);
      CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
    }
  };
  for (int i = 0; i < 1000; ++i) pair();
  std::vector<double> ns(static_cast<std::size_t>(iters / kWindow));
  for (double& v : ns) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kWindow; ++i) pair();
    v = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kWindow;
  }
  std::sort(ns.begin(), ns.end());
  std::printf("shim name=%s size=%zu median_ns=%.1f p99_ns=%.1f\n", name, size, ns[ns.size() / 2],
              ns[ns.size() * 99 / 100]);
}

// Pairs of the driver's own pool (cuMemAllocFromPoolAsync), which cudalloc passes through: what
// its free hook costs a pointer it does not own (bench_pairs --vs-pool times these on the GPU).
static void pool_pairs(std::size_t size, CUstream stream, int iters) {
  if (g_only && std::strcmp(g_only, "pool")) return;
  auto& c = client::client();
  using PFN_default_pool = CUresult (*)(CUmemoryPool*, CUdevice);
  using PFN_from_pool = CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
  auto default_pool = c.get<PFN_default_pool>("cuDeviceGetDefaultMemPool");
  auto from_pool = c.get<PFN_from_pool>("cuMemAllocFromPoolAsync");
  CUmemoryPool pool = nullptr;
  CHECK_OR_DIE(default_pool != nullptr && from_pool != nullptr && default_pool(&pool, 0) == CUDA_SUCCESS);
  constexpr int kWindow = 8;
  auto pair = [&] {
    CUdeviceptr p = 0;
    CHECK_OR_DIE(from_pool(&p, size, pool, stream) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuMemFreeAsync(p, stream) == CUDA_SUCCESS);
  };
  for (int i = 0; i < 1000; ++i) pair();
  std::vector<double> ns(static_cast<std::size_t>(std::max(1, iters / kWindow)));
  for (double& v : ns) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kWindow; ++i) pair();
    v = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kWindow;
  }
  std::sort(ns.begin(), ns.end());
  std::printf("shim name=pool size=%zu median_ns=%.1f p99_ns=%.1f\n", size, ns[ns.size() / 2], ns[ns.size() * 99 / 100]);
}

static void threads(int n, std::size_t size, int iters) {
  auto& c = client::client();
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t) {
    ts.emplace_back([&] {
      CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
      CUstream s = nullptr;
      CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
      auto pair = [&] {
        CUdeviceptr p = 0;
        CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, size) == CUDA_SUCCESS);
        CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
      };
      for (int i = 0; i < 2000; ++i) pair();  // past the first fenced batch
      ready++;
      while (!go) std::this_thread::yield();
      for (int i = 0; i < iters; ++i) pair();
    });
  }
  while (ready < n) std::this_thread::yield();
  const auto t0 = Clock::now();
  go = true;
  for (auto& t : ts) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("shim threads=%d size=%zu pairs_per_s=%.0f\n", n, size, n * iters / secs);
}

int main(int argc, char** argv) {
  int iters = 2000000;
  const char* only = nullptr;  // --only cuMemFree|cuMemFreeAsync|cuMemFreeAsyncLegacy|cuMemFreeAsyncPerThread|pool
  std::size_t only_size = 0;
  int nthreads = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--only")) only = argv[++i];
    if (!std::strcmp(argv[i], "--size")) only_size = std::strtoull(argv[++i], nullptr, 10);
    if (!std::strcmp(argv[i], "--threads")) nthreads = std::atoi(argv[++i]);
  }
  g_only = only;
  if (nthreads > 0) {
    threads(nthreads, only_size != 0 ? only_size : 64 << 10, iters);
    return 0;
  }
  auto& c = client::client();
  CUstream s = nullptr;
  CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  if (only != nullptr && !std::strcmp(only, "pool")) {
    pool_pairs(only_size != 0 ? only_size : 512, s, iters);
    return 0;
  }
  if (only_size != 0) {  // --size N: the frees at that size only, async on both kinds of stream
    pairs("cuMemFree", only_size, nullptr, false, iters);
    pairs("cuMemFreeAsync", only_size, s, true, iters);
    pairs("cuMemFreeAsyncLegacy", only_size, nullptr, true, iters);
    pairs("cuMemFreeAsyncPerThread", only_size, CU_STREAM_PER_THREAD, true, iters);
    return 0;
  }
  pairs("cuMemFree", 64 << 10, nullptr, false, iters);
  pairs("cuMemFreeAsync", 64 << 10, s, true, iters);
  pairs("cuMemFree", 16 << 20, nullptr, false, iters / 4);
  pairs("cuMemFreeAsync", 16 << 20, s, true, iters / 4);
  return 0;
}
