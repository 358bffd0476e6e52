// Allocate+free pair latency, the way legacy CUDA codes call it (static runtime by default).
//   pairs [--async] [--driver] [--iters N] [--size BYTES] [--repeat N] [--threads T [--no-streams]] [--mix LIVE]
//   pairs --async --vs-pool [--iters N] [--size BYTES] [--rounds R]
//   pairs [--async] --threads-ab A,B [--iters N] [--rounds R] [--no-streams]
//   pairs [--async] --threads-seq N [--iters N] [--rounds R] [--no-streams] [--private]
//   pairs --short N [--size BYTES]
//   pairs --short-threads T [--iters N] [--size BYTES]
//   pairs --mix LIVE --vs-pool [--iters N]
//   pairs --host [--iters N] [--size BYTES]
// Prints one line per size: median and p99 nanoseconds per pair (timed in windows of kWindow
// pairs, so the clock's own cost is not counted as allocator time), or for --mix the median
// per operation of a random mix held near LIVE live blocks (random_mix.h: sizes 512 B to
// 8 MiB, log-uniform, filled to LIVE first). With --threads, every thread runs the loop (of
// --size bytes, default 64 KiB) on its own non-blocking stream and the line gives the total
// throughput in pairs per second;
// --no-streams makes no stream (cudaMalloc pairs only): a context with the legacy stream alone,
// as in a legacy code, whose device fences order reuse without waiting (driver/driver_backend.h).
// --repeat N times each size N times in one process, each timing between two runs of a fixed
// CPU loop (reference_before_ns, reference_after_ns): scripts/pair-over-time reads them.
// --vs-pool times cudaMallocAsync pairs and cudaMallocFromPoolAsync pairs on the device's default
// pool in one process, in alternating blocks: under cudalloc the first are cudalloc's and the
// second the driver's pool (cudalloc passes pool allocations through), so both run on the same
// vCPU at the same time. A virtual machine's vCPUs can run the same instructions at very
// different speeds, and separate processes draw different ones (docs/benchmarks.md). Natively both
// are the pool, which checks that the two calls cost the same.
// --threads-ab A,B runs the --threads loop with A threads, then B, alternating for R rounds in one
// process, and gives each count's median and their ratio.
// --short N times loops of N pairs counted from the very first pair of each size (the cache
// starts empty for it: nothing warms it up), at 512 B and the powers of 4 from 1 KiB to 1 GiB
// (or --size), on both paths, against the same loop on the driver's pool (cudaMallocFromPoolAsync on the
// default pool, which cudalloc passes through) in this process: what a short-lived loop pays
// for fresh segments and fences before any block comes back. One line per size and path, with
// the first 10 pairs' and the whole loop's mean. Run one size per process (--size) for sizes
// that must not find the previous size's memory.
// --short-threads T runs T threads at once, each making a non-blocking stream and --iters
// cudaMalloc pairs of --size bytes (default 64 KiB), then exiting, and the same with the
// driver's pool on each thread's stream: pairs per second over the whole run, thread starts
// and stream creations included.
// --mix LIVE --vs-pool runs the mix on both of cudalloc's paths, on the driver's pool, and with
// no allocator at all (harness=1: the random draws and the clock the others' figures include).
// --threads-seq N runs N threads, each pinned to a vCPU of its own (one per physical core where
// the topology says which vCPUs share one), one at a time and then all at once, alternating for R
// rounds, and gives both rates and their ratio: thread scaling on the same vCPUs. With --private
// the threads run work that shares nothing instead (private_work): the host's own ceiling.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <string>
#include <vector>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "random_mix.h"

using Clock = std::chrono::steady_clock;

static void die(cudaError_t e, const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(3);
}

// --driver: the driver entry points the runtime would call, looked up the runtime's way, so
// that the runtime's own share of a pair shows as the difference.
static struct {
  bool on = false;
  decltype(&cuMemAlloc_v2) alloc;
  decltype(&cuMemFree_v2) free;
  decltype(&cuMemAllocAsync) alloc_async;
  decltype(&cuMemFreeAsync) free_async;
} drv;

template <typename F>
static void lookup(const char* name, F* out) {
  cudaDriverEntryPointQueryResult q;
  void* f = nullptr;
  if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess || f == nullptr) {
    std::fprintf(stderr, "lookup %s failed\n", name);
    std::exit(3);
  }
  *out = reinterpret_cast<F>(f);
}

static void* alloc(size_t n, bool async, cudaStream_t s) {
  void* p = nullptr;
  if (drv.on) {
    CUdeviceptr d = 0;
    CUresult r = async ? drv.alloc_async(&d, n, s) : drv.alloc(&d, n);
    if (r != CUDA_SUCCESS) die(cudaErrorMemoryAllocation, "driver alloc");
    return reinterpret_cast<void*>(d);
  }
  cudaError_t e = async ? cudaMallocAsync(&p, n, s) : cudaMalloc(&p, n);
  if (e != cudaSuccess) die(e, "alloc");
  return p;
}
static void release(void* p, bool async, cudaStream_t s) {
  if (drv.on) {
    const auto d = reinterpret_cast<CUdeviceptr>(p);
    if ((async ? drv.free_async(d, s) : drv.free(d)) != CUDA_SUCCESS) die(cudaErrorInvalidValue, "driver free");
    return;
  }
  cudaError_t e = async ? cudaFreeAsync(p, s) : cudaFree(p);
  if (e != cudaSuccess) die(e, "free");
}

constexpr int kWindow = 8;

// The driver's pool, past cudalloc: cudaMallocFromPoolAsync on the device's default pool.
static void* pool_alloc(size_t n, cudaStream_t s) {
  static cudaMemPool_t pool = [] {
    cudaMemPool_t p;
    cudaDeviceGetDefaultMemPool(&p, 0);
    return p;
  }();
  void* p = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(&p, n, pool, s);
  if (e != cudaSuccess) die(e, "cudaMallocFromPoolAsync");
  return p;
}

// Which allocator a short loop, mix or short-lived thread runs on. kNone calls no allocator:
// a mix on it times the harness alone (its random draws and its clock).
enum class Path { kMalloc, kAsync, kPool, kNone };
static const char* path_name(Path p) {
  return p == Path::kMalloc ? "cudaMalloc" : p == Path::kAsync ? "async" : p == Path::kPool ? "pool" : "none";
}
static void* path_alloc(Path p, size_t n, cudaStream_t s) {
  if (p == Path::kNone) {
    static volatile uintptr_t next = 0;  // a distinct pointer each time, as an allocator's
    next = next + 512;
    return reinterpret_cast<void*>(next);
  }
  return p == Path::kPool ? pool_alloc(n, s) : alloc(n, p == Path::kAsync, s);
}
static void path_release(Path p, void* ptr, cudaStream_t s) {
  if (p != Path::kNone) release(ptr, p != Path::kMalloc, s);
}

// A fixed piece of CPU work with no CUDA in it, timed around each --repeat timing: four
// independent xorshift chains updating a 16 KiB table, so that it is bound by the core's
// throughput, as an allocator's hot path is, and slows when the host runs another thread on
// the same core. (A single dependent chain hardly does: a busy sibling thread leaves it almost
// unchanged, while it slows this one markedly.)
static double reference_ns() {
  constexpr int kIters = 200000;
  static std::vector<uint64_t> table(2048);
  uint64_t a = 1, b = 2, c = 3, d = 4;
  const auto t0 = Clock::now();
  for (int i = 0; i < kIters; ++i) {
    a ^= a << 13, a ^= a >> 7, a ^= a << 17;
    b ^= b << 13, b ^= b >> 7, b ^= b << 17;
    c ^= c << 13, c ^= c >> 7, c ^= c << 17;
    d ^= d << 13, d ^= d >> 7, d ^= d << 17;
    table[a & 1023] += b;
    table[1024 + (c & 1023)] += d;
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kIters;
  if (table[0] == 42) std::printf(" ");  // keeps the loop
  return ns;
}

// With `repeats` > 1 each timing is printed with reference_ns() measured just before and just
// after it, so that a slow timing can be told apart from a slow host.
static void pairs(size_t size, bool async, int iters, int repeats) {
  cudaStream_t s = nullptr;
  if (async) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  // Warm up for 50 ms: right after context creation the driver's own threads are still busy
  // for a while, and a first size timed then came out up to twice as slow.
  for (auto until = Clock::now() + std::chrono::milliseconds(50); Clock::now() < until;) {
    for (int i = 0; i < 100; ++i) release(alloc(size, async, s), async, s);
  }
  const int windows = std::max(1, iters / kWindow);
  std::vector<double> ns(windows);
  for (int r = 0; r < repeats; ++r) {
    const double before = repeats > 1 ? reference_ns() : 0;
    for (int w = 0; w < windows; ++w) {
      auto t0 = Clock::now();
      for (int i = 0; i < kWindow; ++i) release(alloc(size, async, s), async, s);
      ns[w] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kWindow;
    }
    const double after = repeats > 1 ? reference_ns() : 0;
    std::sort(ns.begin(), ns.end());
    std::printf("pair size=%zu async=%d%s median_ns=%.0f p99_ns=%.0f", size, async, drv.on ? " driver=1" : "",
                ns[windows / 2], ns[static_cast<size_t>(windows * 0.99)]);
    if (repeats > 1) std::printf(" reference_before_ns=%.2f reference_after_ns=%.2f", before, after);
    std::printf("\n");
  }
  if (s) cudaStreamDestroy(s);
}

// `path` chooses the allocator; without --vs-pool it follows --async.
static void mix(size_t max_live, bool async, int ops, Path path) {
  cudaStream_t s = nullptr;
  if (path != Path::kMalloc) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  bench::RandomMix<void*> mix(max_live);
  auto take = [&](size_t n) { return path_alloc(path, n, s); };
  auto give = [&](void* p) { path_release(path, p, s); };
  mix.fill(take);
  std::vector<double> ns(ops);
  for (int i = 0; i < ops; ++i) {
    auto t0 = Clock::now();
    mix.step(take, give);
    ns[i] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  std::sort(ns.begin(), ns.end());
  double sum = 0;
  for (double v : ns) sum += v;
  std::printf("mix live=%zu async=%d%s median_ns=%.0f p99_ns=%.0f mean_ns=%.0f\n", max_live, async,
              path == Path::kPool ? " pool=1" : path == Path::kNone ? " harness=1" : "", ns[ops / 2],
              ns[static_cast<size_t>(ops * 0.99)], sum / ops);
  mix.drain(give);
  if (s) cudaStreamDestroy(s);
}

// --short: `n` pairs of one size from the first, on one path; the loop's mean and its first
// 10 pairs' mean (the first is where a fresh segment is cut).
static void short_loop(size_t size, int n, Path path, cudaStream_t s) {
  constexpr int kFirst = 10;
  const auto t0 = Clock::now();
  Clock::time_point first_done = t0;
  for (int i = 0; i < n; ++i) {
    path_release(path, path_alloc(path, size, s), s);
    if (i + 1 == kFirst) first_done = Clock::now();
  }
  const auto t1 = Clock::now();
  const double all = std::chrono::duration<double, std::nano>(t1 - t0).count();
  const double first = std::chrono::duration<double, std::nano>(first_done - t0).count();
  std::printf("short size=%zu pairs=%d path=%s mean_ns=%.0f first10_mean_ns=%.0f\n", size, n, path_name(path),
              all / n, n >= kFirst ? first / kFirst : 0.0);
}

static void short_loops(int n, size_t only_size) {
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  // 512 B, then the powers of 4 from 1 KiB to 1 GiB; --size runs that size alone.
  std::vector<size_t> sizes{512};
  for (size_t size = 1024; size <= (size_t{1} << 30); size *= 4) sizes.push_back(size);
  if (only_size != 0) sizes = {only_size};
  for (size_t size : sizes) {
    for (Path p : {Path::kMalloc, Path::kAsync, Path::kPool}) short_loop(size, n, p, s);
  }
  cudaStreamDestroy(s);
}

// --short-threads: `n` threads started at once, each making a non-blocking stream and `iters`
// pairs on `path`, then destroying the stream and exiting; pairs per second over the run.
static double short_threads(int n, size_t size, int iters, Path path) {
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t) {
    ts.emplace_back([&] {
      while (!go) std::this_thread::yield();
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      for (int i = 0; i < iters; ++i) path_release(path, path_alloc(path, size, s), s);
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    });
  }
  const auto t0 = Clock::now();
  go = true;
  for (auto& t : ts) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  return n * iters / secs;
}

// --private: instead of pairs, work that shares nothing, as core_pairs' private_loop: per
// iteration two lock/unlock pairs on a thread-private lock and two updates at random in a
// 256 KiB thread-private table. Run the --threads-seq way, its ratio is what the host's vCPUs
// give 8 pinned threads at all, the ceiling for an allocator's.
static bool g_private = false;

static void private_work(int iters) {
  constexpr size_t kSlots = 32768;
  thread_local std::vector<uint64_t> table(kSlots);
  thread_local uint64_t x = 88172645463325252ull;
  std::atomic<bool> lock{false};
  auto locked = [&](auto&& f) {
    while (lock.exchange(true, std::memory_order_acquire)) {
    }
    f();
    lock.store(false, std::memory_order_release);
  };
  for (int i = 0; i < iters; ++i) {
    locked([&] {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      table[x & (kSlots - 1)] += x;
    });
    locked([&] { table[(x >> 17) & (kSlots - 1)] -= 1; });
  }
  static std::atomic<uint64_t> sink;
  sink.fetch_add(table[x & (kSlots - 1)], std::memory_order_relaxed);  // keeps the loop
}

// `iters` pairs (or, with --private, iterations of private_work).
static void loop(int iters, size_t size, bool async, cudaStream_t s) {
  if (g_private) return private_work(iters);
  for (int i = 0; i < iters; ++i) release(alloc(size, async, s), async, s);
}

// The spread of the threads' own times, for the last threads() run: the first thread done and
// the last one against the run's median thread (a rate over the whole run counts until the last).
static double g_first_done = 0, g_last_done = 0;

// `n` vCPUs for --threads-seq, one per physical core while the topology names enough cores
// (thread_siblings_list): two threads on one core's hyperthreads would measure the core, not
// the allocator.
static std::vector<int> pick_cpus(int n) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
  std::vector<int> picked, siblings_taken, rest;
  for (int c = 0; c < CPU_SETSIZE && static_cast<int>(picked.size()) < n; ++c) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (std::find(siblings_taken.begin(), siblings_taken.end(), c) != siblings_taken.end()) {
      rest.push_back(c);
      continue;
    }
    picked.push_back(c);
    char path[128];
    std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
    if (FILE* f = std::fopen(path, "r")) {
      // "3,19" or "2-3": every listed vCPU shares this one's core.
      int a = 0, b = 0;
      char sep = 0;
      while (std::fscanf(f, "%d%c", &a, &sep) >= 1) {
        b = a;
        if (sep == '-' && std::fscanf(f, "%d%c", &b, &sep) < 1) break;
        for (int x = a; x <= b; ++x) siblings_taken.push_back(x);
        if (sep != ',') break;
      }
      std::fclose(f);
    }
  }
  for (int c : rest) {
    if (static_cast<int>(picked.size()) == n) break;
    picked.push_back(c);
  }
  return static_cast<int>(picked.size()) == n ? picked : std::vector<int>{};
}

// `n` threads of `iters` pairs each. With `cpus`, thread t runs on cpus[t] only. With
// `one_at_a_time`, each runs its pairs alone, in turn, while the others sleep, and the rate is
// over the sum of their own times: the same work on the same vCPUs as all at once, with nothing
// shared in time.
static double threads(int n, size_t size, bool async, int iters, bool streams, const std::vector<int>* cpus = nullptr,
                      bool one_at_a_time = false) {
  std::atomic<int> ready{0}, done{0}, turn{0};
  std::atomic<bool> go{false}, finished{false};
  std::vector<std::thread> ts;
  std::vector<double> took(static_cast<size_t>(n));
  Clock::time_point t0;
  for (int t = 0; t < n; ++t) {
    ts.emplace_back([&, t] {
      if (cpus != nullptr) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET((*cpus)[static_cast<size_t>(t)], &one);
        pthread_setaffinity_np(pthread_self(), sizeof one, &one);
      }
      cudaStream_t s = nullptr;
      if (streams && !g_private) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      // Past the first fenced batch of a thread cache (256 blocks), so the timed part is the
      // steady state, not the first segments being cut.
      loop(2000, size, async, s);
      ready++;
      while (!go) std::this_thread::yield();
      if (one_at_a_time) {
        // Asleep, not spinning: a waiting thread must not take time from the one running.
        while (turn != t) std::this_thread::sleep_for(std::chrono::microseconds(50));
        const auto mine = Clock::now();
        loop(iters, size, async, s);
        took[static_cast<size_t>(t)] = std::chrono::duration<double>(Clock::now() - mine).count();
        turn++;
      } else {
        loop(iters, size, async, s);
        took[static_cast<size_t>(t)] = std::chrono::duration<double>(Clock::now() - t0).count();
      }
      done++;
      // Destroyed once every thread is done, so that no destroy lands inside another's timing.
      while (!finished) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (s) cudaStreamDestroy(s);
    });
  }
  while (ready < n) std::this_thread::yield();
  t0 = Clock::now();
  go = true;
  while (done < n) std::this_thread::sleep_for(std::chrono::microseconds(20));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  finished = true;
  for (auto& t : ts) t.join();
  double sum = 0;
  for (double x : took) sum += x;
  std::sort(took.begin(), took.end());
  const double mid = took[took.size() / 2];
  g_first_done = took.front() / mid;
  g_last_done = took.back() / mid;
  return n * iters / (one_at_a_time ? sum : s);
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Alternating rounds of `a` and `b` threads in this process (the order flips each round).
static void threads_ab(int a, int b, size_t size, bool async, int iters, bool streams, int rounds) {
  std::vector<double> ra, rb;
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool first_a = (r % 2 == 0) == (k == 0);
      const int n = first_a ? a : b;
      const double rate = threads(n, size, async, iters, streams);
      (first_a ? ra : rb).push_back(rate);
      std::printf("threads_round round=%d threads=%d size=%zu async=%d pairs_per_s=%.0f first_done=%.2f last_done=%.2f\n",
                  r, n, size, async, rate, g_first_done, g_last_done);
    }
  }
  std::printf("threads_ab a=%d b=%d size=%zu async=%d a_pairs_per_s=%.0f b_pairs_per_s=%.0f ratio=%.2f\n", a, b, size,
              async, median(ra), median(rb), median(rb) / median(ra));
}

// The same `n` threads, each pinned to its own vCPU (pick_cpus), run one at a time and then all
// at once, alternating for `rounds` rounds (the order flips each round): what running together
// gives, on the vCPUs that run it. (1 thread against 8, as --threads-ab times it, compares the
// one vCPU the lone thread drew with eight others: a virtual machine's vCPUs can run the same
// loop at very different speeds.)
static int threads_seq(int n, size_t size, bool async, int iters, bool streams, int rounds) {
  const std::vector<int> cpus = pick_cpus(n);
  if (cpus.empty()) {
    std::fprintf(stderr, "--threads-seq %d: fewer vCPUs allowed than threads\n", n);
    return 2;
  }
  std::string list;
  for (int c : cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
  std::vector<double> alone, together;
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool one = (r % 2 == 0) == (k == 0);
      const double rate = threads(n, size, async, iters, streams, &cpus, one);
      (one ? alone : together).push_back(rate);
      std::printf("threads_seq_round round=%d threads=%d one_at_a_time=%d size=%zu async=%d pairs_per_s=%.0f\n", r, n,
                  one ? 1 : 0, size, async, rate);
    }
  }
  std::printf("threads_seq threads=%d size=%zu async=%d%s cpus=%s alone_pairs_per_s=%.0f together_pairs_per_s=%.0f "
              "ratio=%.2f\n",
              n, size, async, g_private ? " private=1" : "", list.c_str(), median(alone), median(together),
              median(together) / median(alone));
  return 0;
}

// The driver's own cuMemFreeAsync, past any preloaded library: glibc's dlsym (found with dlvsym,
// which no interposer here overrides) asked of libcuda.so.1's handle.
static decltype(&cuMemFreeAsync) driver_free_async() {
  using DlsymFn = void* (*)(void*, const char*);
  auto real_dlsym = reinterpret_cast<DlsymFn>(dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34"));
  if (real_dlsym == nullptr) real_dlsym = reinterpret_cast<DlsymFn>(dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5"));
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto f = real_dlsym && h ? reinterpret_cast<decltype(&cuMemFreeAsync)>(real_dlsym(h, "cuMemFreeAsync")) : nullptr;
  if (f == nullptr) {
    std::fprintf(stderr, "the driver's cuMemFreeAsync not found\n");
    std::exit(3);
  }
  return f;
}

// cudaMallocAsync pairs against cudaMallocFromPoolAsync pairs on the default pool, in alternating
// blocks of this process (see the header). A third side frees its pool pairs with the driver's
// own cuMemFreeAsync, so that what a preloaded library adds to a free it passes on (a pointer
// it does not own) is counted out of the pool's figure: against it the ratio is conservative.
static void vs_pool(size_t size, int iters, int rounds, int only) {
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMemPool_t pool;
  cudaDeviceGetDefaultMemPool(&pool, 0);
  auto pool_pair = [&] {
    void* p = nullptr;
    cudaError_t e = cudaMallocFromPoolAsync(&p, size, pool, s);
    if (e != cudaSuccess) die(e, "cudaMallocFromPoolAsync");
    release(p, true, s);
  };
  const auto free_direct = driver_free_async();
  auto direct_pair = [&] {
    void* p = nullptr;
    cudaError_t e = cudaMallocFromPoolAsync(&p, size, pool, s);
    if (e != cudaSuccess) die(e, "cudaMallocFromPoolAsync");
    if (free_direct(reinterpret_cast<CUdeviceptr>(p), s) != CUDA_SUCCESS) die(cudaErrorInvalidValue, "driver free");
  };
  auto ours_pair = [&] { release(alloc(size, true, s), true, s); };
  for (auto until = Clock::now() + std::chrono::milliseconds(50); Clock::now() < until;) {
    for (int i = 0; i < 100; ++i) ours_pair(), pool_pair(), direct_pair();
  }
  const int windows = std::max(1, iters / kWindow / rounds);
  std::vector<double> ours, theirs, direct;
  auto block = [&](auto& pair, std::vector<double>& out) {
    for (int w = 0; w < windows; ++w) {
      auto t0 = Clock::now();
      for (int i = 0; i < kWindow; ++i) pair();
      out.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kWindow);
    }
  };
  // --only ours|pool: one side alone, in as many blocks, for what alternating costs each side.
  for (int r = 0; r < rounds; ++r) {
    if (only != 2) block(ours_pair, ours);
    if (only != 1) block(pool_pair, theirs), block(direct_pair, direct);
  }
  if (ours.empty()) ours = theirs;
  if (theirs.empty()) theirs = direct = ours;
  for (auto* v : {&ours, &theirs, &direct}) std::sort(v->begin(), v->end());
  auto p99 = [](const std::vector<double>& v) { return v[static_cast<size_t>(v.size() * 0.99)]; };
  const double a = ours[ours.size() / 2], b = theirs[theirs.size() / 2], c = direct[direct.size() / 2];
  std::printf("vs_pool size=%zu ours_median_ns=%.0f ours_p99_ns=%.0f pool_median_ns=%.0f pool_p99_ns=%.0f "
              "direct_median_ns=%.0f direct_p99_ns=%.0f ratio=%.2f direct_ratio=%.2f\n",
              size, a, p99(ours), b, p99(theirs), c, p99(direct), b / a, c / a);
  cudaStreamDestroy(s);
}

// --host: cudaHostAlloc + cudaFreeHost pairs (pinned host memory, default flags) of 4 KiB, 64 KiB,
// 1 MiB and 16 MiB (or --size), `iters` of each after one warm-up pair: the mean per pair, since
// natively every pair pins and unpins pages and its cost grows with the size.
static void host_pairs(int iters, size_t only_size) {
  std::vector<size_t> sizes{4096, 65536, 1 << 20, 16 << 20};
  if (only_size != 0) sizes = {only_size};
  for (size_t size : sizes) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, size, cudaHostAllocDefault) != cudaSuccess) die(cudaGetLastError(), "cudaHostAlloc");
    cudaFreeHost(p);
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      if (cudaHostAlloc(&p, size, cudaHostAllocDefault) != cudaSuccess) die(cudaGetLastError(), "cudaHostAlloc");
      static_cast<volatile char*>(p)[0] = 1;  // the memory is used, as a staging buffer is
      cudaFreeHost(p);
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
    std::printf("host size=%zu pairs=%d mean_ns=%.0f\n", size, iters, ns);
  }
}

int main(int argc, char** argv) {
  bool async = false;
  int iters = 20000, nthreads = 0;
  size_t live = 0, only_size = 0;  // --size N: the pairs of that size only
  int repeat = 1;  // --repeat N: time each size N times in this process, between reference_ns() runs
  bool probe = false;  // what one cuCtxGetCurrent costs (the shim asks it per cudaMalloc)
  bool streams = true;  // --threads: each thread makes a non-blocking stream
  bool against_pool = false;
  int ab_a = 0, ab_b = 0, rounds = 10;
  int seq_n = 0;  // --threads-seq N
  int only = 0;  // --vs-pool --only ours|pool: 1 or 2
  int short_n = 0;  // --short N
  int short_t = 0;  // --short-threads T
  bool host = false;  // --host
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--async")) async = true;
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads")) nthreads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--mix")) live = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--driver")) drv.on = true;
    else if (!std::strcmp(argv[i], "--probe")) probe = true;
    else if (!std::strcmp(argv[i], "--no-streams")) streams = false;
    else if (!std::strcmp(argv[i], "--repeat")) repeat = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--size")) only_size = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--vs-pool")) against_pool = true;
    else if (!std::strcmp(argv[i], "--only")) only = std::strcmp(argv[++i], "pool") == 0 ? 2 : 1;
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--threads-seq")) seq_n = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--private")) g_private = true;
    else if (!std::strcmp(argv[i], "--short")) short_n = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--short-threads")) short_t = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--host")) host = true;
    else if (!std::strcmp(argv[i], "--threads-ab")) {
      if (std::sscanf(argv[++i], "%d,%d", &ab_a, &ab_b) != 2 || ab_a < 1 || ab_b < 1) {
        std::fprintf(stderr, "--threads-ab wants two thread counts, as 1,8\n");
        return 2;
      }
    }
  }
  cudaFree(nullptr);  // create the context outside the timings
  if (drv.on) {
    lookup("cuMemAlloc", &drv.alloc);
    lookup("cuMemFree", &drv.free);
    lookup("cuMemAllocAsync", &drv.alloc_async);
    lookup("cuMemFreeAsync", &drv.free_async);
  }
  if (async || against_pool || short_n > 0 || short_t > 0) {  // a warm pool: keep freed memory cached in the driver's pool
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, 0);
    unsigned long long threshold = ~0ull;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  }
  if (probe) {
    decltype(&cuCtxGetCurrent) get = nullptr;
    lookup("cuCtxGetCurrent", &get);
    CUcontext c = nullptr;
    const int n = 1000000;
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) get(&c);
    std::printf("probe cuCtxGetCurrent_ns=%.1f\n", std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n);
    // What stamping a trace record costs with each of the trace's clocks (trace/trace_clock.h).
    timespec ts{};
    long long sum = 0;
    t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      clock_gettime(CLOCK_MONOTONIC, &ts);
      sum += ts.tv_nsec;
    }
    std::printf("probe clock_gettime_ns=%.1f\n", std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n);
#if defined(__x86_64__)
    unsigned aux = 0;
    t0 = Clock::now();
    for (int i = 0; i < n; ++i) sum += static_cast<long long>(__rdtscp(&aux));
    std::printf("probe rdtscp_ns=%.1f\n", std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n);
    t0 = Clock::now();
    for (int i = 0; i < n; ++i) sum += static_cast<long long>(__rdtsc());
    std::printf("probe rdtsc_ns=%.1f\n", std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n);
    t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      _mm_lfence();
      sum += static_cast<long long>(__rdtsc());
    }
    std::printf("probe lfence_rdtsc_ns=%.1f\n", std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n);
#endif
    return sum == 42 ? 1 : 0;  // keeps the loops
  }
  if (async && !streams && (nthreads > 0 || ab_a > 0 || seq_n > 0)) {
    std::fprintf(stderr, "--no-streams is for cudaMalloc pairs\n");
    return 2;
  }
  if (against_pool && live == 0 && (!async || drv.on)) {
    std::fprintf(stderr, "--vs-pool times runtime async pairs: give --async, not --driver\n");
    return 2;
  }
  const size_t thread_size = only_size != 0 ? only_size : 64 * 1024;
  if (g_private && seq_n == 0) {
    std::fprintf(stderr, "--private is for --threads-seq\n");
    return 2;
  }
  if (short_n > 0) {
    short_loops(short_n, only_size);
    return 0;
  }
  if (host) {
    host_pairs(iters, only_size);
    return 0;
  }
  if (short_t > 0) {
    // Each side twice, alternating, so that neither alone meets the process's first threads.
    for (int r = 0; r < 2; ++r) {
      for (Path p : {Path::kMalloc, Path::kPool}) {
        std::printf("short_threads threads=%d size=%zu pairs=%d path=%s round=%d pairs_per_s=%.0f\n", short_t,
                    thread_size, iters, path_name(p), r, short_threads(short_t, thread_size, iters, p));
      }
    }
    return 0;
  }
  if (seq_n > 0) {
    return threads_seq(seq_n, thread_size, async, iters, streams, rounds);
  } else if (ab_a > 0) {
    threads_ab(ab_a, ab_b, thread_size, async, iters, streams, rounds);
  } else if (nthreads > 0) {
    std::printf("threads=%d size=%zu async=%d pairs_per_s=%.0f\n", nthreads, thread_size, async,
                threads(nthreads, thread_size, async, iters, streams));
  } else if (live > 0 && against_pool) {
    for (Path p : {Path::kMalloc, Path::kAsync, Path::kPool, Path::kNone}) mix(live, p == Path::kAsync || p == Path::kPool, iters, p);
  } else if (live > 0) {
    mix(live, async, iters, async ? Path::kAsync : Path::kMalloc);
  } else {
    for (size_t size : {size_t{512}, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{256} << 20}) {
      if (only_size != 0 && size != only_size) continue;
      const int n = size >= (size_t{256} << 20) ? iters / 10 : iters;
      if (against_pool) vs_pool(size, n, rounds, only);
      else pairs(size, async, n, repeat);
    }
  }
  return 0;
}
