// The allocator core alone, on the simulated device: what a cached allocate+free pair costs
// without the shim and the CUDA runtime around it. Runs anywhere (no GPU).
//   core_pairs [--threads N] [--iters N] [--only CASE] [--separate] [--trace PATH [--trace-monotonic]]: pairs
//   at 64 KiB and 16 MiB, both free orders, and private_loop, a baseline of thread-private work
//   (--only: the case of that name, for profiling); with --trace the allocator reports to a
//   TraceWriter writing PATH (what tracing costs), its
//   records stamped with the TSC or, with --trace-monotonic, clock_gettime; with --separate each
//   thread has an allocator (and simulated device) of its own, so that what the threads' sharing
//   of one allocator costs shows as the difference (lines "name=..._separate")
//   core_pairs --mix LIVE [--iters N] [--only device|stream]: the random mix of bench/pairs.cu (random_mix.h: sizes
//   512 B to 8 MiB, log-uniform, held near LIVE live blocks), both free orders: median and p99 ns per operation
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"
#include "allocator/spin_lock.h"
#include "bench/random_mix.h"
#include "trace/trace_writer.h"

using namespace cudalloc;
using Clock = std::chrono::steady_clock;

// Threads of a case start timing together, each past its warm-up, when the main thread says go
// (having read the statistics the timed part is measured from).
class StartLine {
 public:
  explicit StartLine(int threads) : left_(threads) {}
  void arrive_and_wait() {
    left_.fetch_sub(1);
    while (!go_.load()) std::this_thread::yield();
  }
  void wait_all() const {
    while (left_.load() > 0) std::this_thread::yield();
  }
  void go() { go_.store(true); }

 private:
  std::atomic<int> left_;
  std::atomic<bool> go_{false};
};

// Warm-up: past the pipeline's filling (a thread's first cudaFree'd batches take blocks under
// the device lock until the first batch passes its fence: 1,280 allocations for one thread, and
// under contention from the others longer), so that the timed part is the steady state, as in
// bench/pairs.cu's thread sweep.
constexpr int kWarmup = 4000;

static double run(DeviceAllocator& a, std::size_t size, FreeOrder order, StreamHandle stream, int iters,
                  StartLine& start) {
  DevicePtr p = 0;
  for (int i = 0; i < kWarmup; ++i) {
    a.allocate(size, stream, &p);
    a.free(p, order, stream);
  }
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    a.allocate(size, stream, &p);
    a.free(p, order, stream);
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
}

// What the host's cores give work that shares nothing: per iteration two lock/unlock pairs on a
// thread-private lock and two updates at random in a 256 KiB private table (of the order of the
// block records a thread of cudaFree pairs cycles through). Its 8-thread/1-thread ratio is the
// ceiling for the allocator's own: on a virtual machine, vCPUs that share physical cores or a
// clock budget keep it under 8.
static double private_loop(int iters) {
  SpinLock lock;
  constexpr std::size_t kSlots = 32768;
  std::vector<std::uint64_t> table(kSlots);
  std::uint64_t x = 88172645463325252ull;
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    {
      std::lock_guard g(lock);
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      table[x & (kSlots - 1)] += x;
    }
    {
      std::lock_guard g(lock);
      table[(x >> 17) & (kSlots - 1)] -= 1;
    }
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
  static std::atomic<std::uint64_t> sink;
  sink.fetch_add(table[x & (kSlots - 1)], std::memory_order_relaxed);  // keeps the loop
  return ns;
}

// The same steps as bench/pairs.cu's mix (same seed and sizes), so the two can be compared.
static void mix(std::size_t max_live, FreeOrder order, int ops) {
  SimBackend sim({.total_memory = std::size_t{1} << 40, .host_memory = false});
  DeviceAllocator a(sim, AllocatorOptions{});
  const StreamHandle stream = order == FreeOrder::kStream ? 0x100 : kNoStream;
  bench::RandomMix<DevicePtr> mix(max_live);
  auto take = [&](std::size_t n) {
    DevicePtr p = 0;
    if (a.allocate(n, stream, &p) != Status::kOk) std::abort();
    return p;
  };
  auto give = [&](DevicePtr p) { a.free(p, order, stream); };
  mix.fill(take);
  std::vector<double> ns(static_cast<std::size_t>(ops));
  for (double& v : ns) {
    const auto t0 = Clock::now();
    mix.step(take, give);
    v = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  std::sort(ns.begin(), ns.end());
  std::printf("core mix live=%zu async=%d median_ns=%.0f p99_ns=%.0f\n", max_live,
              order == FreeOrder::kStream ? 1 : 0, ns[ns.size() / 2], ns[ns.size() * 99 / 100]);
  mix.drain(give);
}

int main(int argc, char** argv) {
  int threads = 1, iters = 2000000;
  std::size_t live = 0;
  const char* only = nullptr;  // --only: one free order of the mix (device|stream), or one case
  const char* trace = nullptr;
  bool separate = false;
  TraceOptions trace_options;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--only")) only = argv[++i];
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--mix")) live = std::strtoull(argv[++i], nullptr, 10);
    if (!std::strcmp(argv[i], "--trace")) trace = argv[++i];
    if (!std::strcmp(argv[i], "--separate")) separate = true;
    if (!std::strcmp(argv[i], "--trace-monotonic")) trace_options.clock = TraceClockSource::kMonotonic;
  }
  if (live > 0) {
    if (only == nullptr || !std::strcmp(only, "device")) mix(live, FreeOrder::kDevice, iters);
    if (only == nullptr || !std::strcmp(only, "stream")) mix(live, FreeOrder::kStream, iters);
    return 0;
  }
  SimBackend sim({.host_memory = false});
  DeviceAllocator a(sim, AllocatorOptions{});
  std::unique_ptr<TraceWriter> writer;
  if (trace != nullptr) {
    std::string error;
    writer = TraceWriter::open(trace, trace_options, &error);
    if (!writer) {
      std::fprintf(stderr, "core_pairs: %s\n", error.c_str());
      return 1;
    }
    a.set_observer(writer.get());
  }
  struct Case { const char* name; std::size_t size; FreeOrder order; bool stream; bool baseline = false; };
  const Case cases[] = {
      {"cudaFree_64KiB", 64 << 10, FreeOrder::kDevice, false},
      {"cudaFreeAsync_64KiB", 64 << 10, FreeOrder::kStream, true},
      {"cudaFree_16MiB", 16 << 20, FreeOrder::kDevice, false},
      {"cudaFreeAsync_16MiB", 16 << 20, FreeOrder::kStream, true},
      {"private_loop", 0, FreeOrder::kStream, false, true},
  };
  for (const Case& c : cases) {
    if (only != nullptr && std::strcmp(only, c.name) != 0) continue;
    std::vector<double> ns(threads);
    std::vector<std::thread> ts;
    StartLine start(threads);
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        const StreamHandle stream = c.stream ? 0x100 + t : kNoStream;
        if (c.baseline) {
          start.arrive_and_wait();
          ns[t] = private_loop(iters / threads);
        } else if (separate) {
          SimBackend own_sim({.host_memory = false});
          DeviceAllocator own(own_sim, AllocatorOptions{});
          ns[t] = run(own, c.size, c.order, stream, iters / threads, start);
        } else {
          ns[t] = run(a, c.size, c.order, stream, iters / threads, start);
        }
      });
    }
    start.wait_all();
    const MemoryStats before = a.stats();  // locked_*: the timed part's (shared allocator only)
    start.go();
    for (auto& t : ts) t.join();
    const double worst = *std::max_element(ns.begin(), ns.end());
    const MemoryStats after = a.stats();
    std::printf("core name=%s%s%s threads=%d ns_per_pair=%.1f pairs_per_s=%.0f locked_allocs=%lld locked_frees=%lld\n", c.name,
                writer ? "_traced" : "", separate && !c.baseline ? "_separate" : "", threads, worst, threads * 1e9 / worst,
                static_cast<long long>(after.num_locked_allocs - before.num_locked_allocs),
                static_cast<long long>(after.num_locked_frees - before.num_locked_frees));
  }
  return 0;
}
