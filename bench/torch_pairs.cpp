// bench/pairs.cu's cases against PyTorch's own caching allocator, called from C++ the way
// libtorch code and extensions call it: c10::cuda::CUDACachingAllocator::raw_alloc/raw_delete.
//   torch_pairs [--stream] [--iters N] [--threads T] [--mix LIVE]
// Same cases and same output lines as pairs.cu, so scripts/bench parses both alike: one line
// per size with the median and p99 nanoseconds per allocate+free pair (timed in windows of 8
// pairs, as pairs.cu times them); for --mix the median per operation of a random mix with at
// most LIVE live blocks (sizes 512 B to 8 MiB, log-uniform);
// with --threads, every thread runs the loop on its own non-blocking stream (one of PyTorch's
// pool streams, made current with a CUDAStreamGuard, as pairs.cu gives every thread its own
// cudaStreamNonBlocking stream) and the line gives the total throughput in pairs per second.
// --stream runs the pair and mix cases on a pool stream (raw_alloc_with_stream) instead of the
// thread's current stream (the legacy default stream). "async=0" on every line: the field
// names pairs.cu's cudaMallocAsync mode, which has no counterpart here.
//
// Built by scripts/bench on the GPU machine against the installed torch (g++ -O2 -std=c++17,
// torch's include and library folders, -ltorch -ltorch_cuda -lc10 -lc10_cuda -lcudart).
// Run it without PYTORCH_NO_CUDA_MEMORY_CACHING (that turns the cache off) and without
// PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (that swaps the allocator).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <thread>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "random_mix.h"

namespace alloc = c10::cuda::CUDACachingAllocator;
using Clock = std::chrono::steady_clock;

// stream == nullptr: the calling thread's current stream (raw_alloc), as PyTorch code does.
static void* take(size_t n, cudaStream_t stream) {
  void* p = stream ? alloc::raw_alloc_with_stream(n, stream) : alloc::raw_alloc(n);
  if (p == nullptr) {
    std::fprintf(stderr, "raw_alloc(%zu) returned null\n", n);
    std::exit(3);
  }
  return p;
}
static void give(void* p) { alloc::raw_delete(p); }

static cudaStream_t pool_stream(bool on) {
  return on ? c10::cuda::getStreamFromPool(false).stream() : nullptr;
}

// Timed in windows of kWindow pairs, as pairs.cu does, so that the clock's own cost, a sizable
// part of a cached pair, is not counted as allocator time.
constexpr int kWindow = 8;

static void pairs(size_t size, bool on_stream, int iters) {
  cudaStream_t s = pool_stream(on_stream);
  for (int i = 0; i < 100; ++i) give(take(size, s));  // warm up
  const int windows = std::max(1, iters / kWindow);
  std::vector<double> ns(windows);
  for (int w = 0; w < windows; ++w) {
    auto t0 = Clock::now();
    for (int i = 0; i < kWindow; ++i) give(take(size, s));
    ns[w] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kWindow;
  }
  std::sort(ns.begin(), ns.end());
  std::printf("pair size=%zu async=0 stream=%d median_ns=%.0f p99_ns=%.0f\n", size, on_stream ? 1 : 0,
              ns[windows / 2], ns[static_cast<size_t>(windows * 0.99)]);
  std::fflush(stdout);
}

static void mix(size_t max_live, bool on_stream, int ops) {
  cudaStream_t s = pool_stream(on_stream);
  bench::RandomMix<void*> mix(max_live);  // the same sequence of sizes and choices as pairs.cu
  auto alloc = [&](size_t n) { return take(n, s); };
  mix.fill(alloc);
  std::vector<double> ns(ops);
  for (int i = 0; i < ops; ++i) {
    auto t0 = Clock::now();
    mix.step(alloc, give);
    ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  std::sort(ns.begin(), ns.end());
  std::printf("mix live=%zu async=0 stream=%d median_ns=%.0f p99_ns=%.0f\n", max_live, on_stream ? 1 : 0,
              ns[ops / 2], ns[static_cast<size_t>(ops * 0.99)]);
  std::fflush(stdout);
  mix.drain(give);
}

static void threads(int n, size_t size, int iters) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t) {
    ts.emplace_back([&] {
      try {
        // One of PyTorch's pool streams (created cudaStreamNonBlocking), current for this
        // thread only: raw_alloc allocates on the current stream, as a kernel launcher would.
        c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false));
        for (int i = 0; i < 100; ++i) give(take(size, nullptr));
        ready++;
        while (!go) std::this_thread::yield();
        for (int i = 0; i < iters; ++i) give(take(size, nullptr));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thread: %s\n", e.what());
        std::exit(3);
      }
    });
  }
  while (ready < n) std::this_thread::yield();
  auto t0 = Clock::now();
  go = true;
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("threads=%d size=%zu async=0 pairs_per_s=%.0f\n", n, size, n * iters / s);
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  bool on_stream = false;
  int iters = 20000, nthreads = 0;
  size_t live = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--stream")) on_stream = true;
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) nthreads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--mix") && i + 1 < argc) live = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: %s [--stream] [--iters N] [--threads T] [--mix LIVE]\n", argv[0]);
      return 2;
    }
  }
  if (iters < 1) iters = 1;
  try {
    if (std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING") != nullptr) {
      std::fprintf(stderr, "warning: PYTORCH_NO_CUDA_MEMORY_CACHING is set: PyTorch's cache is off\n");
    }
    const int devices = static_cast<int>(c10::cuda::device_count());
    if (devices < 1) {
      std::fprintf(stderr, "no CUDA device\n");
      return 3;
    }
    // libtorch initializes the allocator on its first CUDA tensor; a program that calls the
    // allocator directly does it itself (idempotent). Then one pair creates the context and
    // the allocator's per-device state outside the timings, like pairs.cu's cudaFree(nullptr).
    alloc::init(devices);
    give(take(512, nullptr));
    if (nthreads > 0) {
      threads(nthreads, 64 * 1024, iters);
    } else if (live > 0) {
      mix(live, on_stream, iters);
    } else {
      for (size_t size : {size_t{512}, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{256} << 20}) {
        pairs(size, on_stream, size >= (size_t{256} << 20) ? std::max(1, iters / 10) : iters);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_pairs: %s\n", e.what());
    return 3;
  }
  return 0;
}
