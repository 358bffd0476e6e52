// The allocator core alone, on the simulated device: what a cached allocate+free pair costs
// without the shim and the CUDA runtime around it. Runs anywhere (no GPU).
//   core_pairs [--threads N] [--iters N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"

using namespace cudalloc;
using Clock = std::chrono::steady_clock;

static double run(DeviceAllocator& a, std::size_t size, FreeOrder order, StreamHandle stream, int iters) {
  DevicePtr p = 0;
  for (int i = 0; i < 1000; ++i) {
    a.allocate(size, stream, &p);
    a.free(p, order, stream);
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    a.allocate(size, stream, &p);
    a.free(p, order, stream);
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
}

int main(int argc, char** argv) {
  int threads = 1, iters = 2000000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[++i]);
  }
  SimBackend sim({.host_memory = false});
  DeviceAllocator a(sim, AllocatorOptions{});
  struct Case { const char* name; std::size_t size; FreeOrder order; bool stream; };
  const Case cases[] = {
      {"cudaFree_64KiB", 64 << 10, FreeOrder::kDevice, false},
      {"cudaFreeAsync_64KiB", 64 << 10, FreeOrder::kStream, true},
      {"cudaFree_16MiB", 16 << 20, FreeOrder::kDevice, false},
      {"cudaFreeAsync_16MiB", 16 << 20, FreeOrder::kStream, true},
  };
  for (const Case& c : cases) {
    std::vector<double> ns(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] { ns[t] = run(a, c.size, c.order, c.stream ? 0x100 + t : kNoStream, iters / threads); });
    }
    for (auto& t : ts) t.join();
    const double worst = *std::max_element(ns.begin(), ns.end());
    std::printf("core name=%s threads=%d ns_per_pair=%.1f pairs_per_s=%.0f\n", c.name, threads, worst,
                threads * 1e9 / worst);
  }
  return 0;
}
