// Allocate+free pair latency, the way legacy CUDA codes call it (static runtime by default).
//   pairs [--async] [--iters N] [--threads T] [--mix LIVE]
// Prints one line per size: median and p99 nanoseconds per pair, or for --mix the median
// per operation of a random mix with at most LIVE live blocks (sizes 512 B to 8 MiB,
// log-uniform). With --threads, every thread runs the loop on its own non-blocking stream
// and the line gives the total throughput in pairs per second.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

using Clock = std::chrono::steady_clock;

static void die(cudaError_t e, const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(3);
}

static void* alloc(size_t n, bool async, cudaStream_t s) {
  void* p = nullptr;
  cudaError_t e = async ? cudaMallocAsync(&p, n, s) : cudaMalloc(&p, n);
  if (e != cudaSuccess) die(e, "alloc");
  return p;
}
static void release(void* p, bool async, cudaStream_t s) {
  cudaError_t e = async ? cudaFreeAsync(p, s) : cudaFree(p);
  if (e != cudaSuccess) die(e, "free");
}

static void pairs(size_t size, bool async, int iters) {
  cudaStream_t s = nullptr;
  if (async) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int i = 0; i < 100; ++i) release(alloc(size, async, s), async, s);  // warm up
  std::vector<double> ns(iters);
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    void* p = alloc(size, async, s);
    release(p, async, s);
    ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  std::sort(ns.begin(), ns.end());
  std::printf("pair size=%zu async=%d median_ns=%.0f p99_ns=%.0f\n", size, async, ns[iters / 2],
              ns[static_cast<size_t>(iters * 0.99)]);
  if (s) cudaStreamDestroy(s);
}

static void mix(size_t max_live, bool async, int ops) {
  cudaStream_t s = nullptr;
  if (async) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> logsize(std::log(512.0), std::log(8.0 * 1024 * 1024));
  std::vector<void*> live;
  live.reserve(max_live);
  auto step = [&] {
    if (live.size() < max_live && (live.empty() || rng() % 2)) {
      live.push_back(alloc(static_cast<size_t>(std::exp(logsize(rng))), async, s));
    } else {
      size_t i = rng() % live.size();
      release(live[i], async, s);
      live[i] = live.back();
      live.pop_back();
    }
  };
  for (size_t i = 0; i < 2 * max_live; ++i) step();  // fill
  std::vector<double> ns(ops);
  for (int i = 0; i < ops; ++i) {
    auto t0 = Clock::now();
    step();
    ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  std::sort(ns.begin(), ns.end());
  std::printf("mix live=%zu async=%d median_ns=%.0f p99_ns=%.0f\n", max_live, async, ns[ops / 2],
              ns[static_cast<size_t>(ops * 0.99)]);
  for (void* p : live) release(p, async, s);
}

static void threads(int n, size_t size, bool async, int iters) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t) {
    ts.emplace_back([&] {
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      for (int i = 0; i < 100; ++i) release(alloc(size, async, s), async, s);
      ready++;
      while (!go) std::this_thread::yield();
      for (int i = 0; i < iters; ++i) release(alloc(size, async, s), async, s);
    });
  }
  while (ready < n) std::this_thread::yield();
  auto t0 = Clock::now();
  go = true;
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("threads=%d size=%zu async=%d pairs_per_s=%.0f\n", n, size, async, n * iters / s);
}

int main(int argc, char** argv) {
  bool async = false;
  int iters = 20000, nthreads = 0;
  size_t live = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--async")) async = true;
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads")) nthreads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--mix")) live = std::strtoull(argv[++i], nullptr, 10);
  }
  cudaFree(nullptr);  // create the context outside the timings
  if (async) {  // a warm pool: keep freed memory cached in the driver's pool
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, 0);
    unsigned long long threshold = ~0ull;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  }
  if (nthreads > 0) {
    threads(nthreads, 64 * 1024, async, iters);
  } else if (live > 0) {
    mix(live, async, iters);
  } else {
    for (size_t size : {size_t{512}, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{256} << 20}) {
      pairs(size, async, size >= (size_t{256} << 20) ? iters / 10 : iters);
    }
  }
  return 0;
}
