// What the short loops of bench/pairs.cu cost in calls rather than time: the same loops through
// the preloaded shim over the fake driver (tests/fake_driver), counting per phase the driver
// calls (the fake driver's counters), the fences recorded, the segments cut and the operations
// that took the device lock (cudalloc_stat). The fake driver's own costs differ from a real
// one's, so the counts are the figures to compare; ns_per_pair is only a hint.
//   LD_PRELOAD=build/shim/libcudalloc.so LD_LIBRARY_PATH=build/tests/fake_driver
//   FAKE_CUDA_LOOKUP_TSV=tests/fake_driver/cudart13-driver-lookups.tsv build/bench/shim_counts MODE ...
// Modes (one line of key=value per phase):
//   pairs --size N --pairs P [--warm W] [--stream none|blocking|nonblocking] [--async]
//       P pairs counted from the first, after W warm-up pairs (counted as a phase of their own);
//       prints checkpoints at 10, 100, 256, 500, 1000, 2000, 5000 pairs and the pair of the first
//       reuse (a pointer handed out before, numbered from the first warm-up pair); with --runs,
//       the runs of pairs whose allocation took the device lock.
//   sweep --pairs P [--async]: the pairs mode at 512 B, 2 KiB, ... 1 GiB (powers of 4), one
//       after the other in this process, each counted apart.
//   mix --live L --ops O [--async]: a random mix (random_mix.h: 512 B to 8 MiB, log-uniform,
//       held near L live).
//   threads --threads T --pairs P [--size N]: T threads started together, each making a
//       non-blocking stream and P cudaMalloc pairs, then exiting.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "client.h"
#include "random_mix.h"

using Clock = std::chrono::steady_clock;

namespace {

using StatFn = int (*)(int, const char*, int64_t*);

struct Counts {
  uint64_t mem_alloc = 0, mem_free = 0, alloc_async = 0, free_async = 0;
  uint64_t ctx_events = 0, event_records = 0, event_queries = 0, event_syncs = 0, stream_waits = 0;
  int64_t locked_allocs = 0, locked_frees = 0, bridges = 0, segments = 0, reserved = 0, device_allocs = 0;
  int64_t hits = 0, misses = 0;
};

StatFn stat_fn() {
  static StatFn f = reinterpret_cast<StatFn>(dlsym(RTLD_DEFAULT, "cudalloc_stat"));
  return f;
}

int64_t stat(const char* key) {
  int64_t v = 0;
  if (StatFn f = stat_fn()) f(0, key, &v);
  return v;
}

Counts now() {
  auto& c = client::client();
  Counts k;
  const fakecuda_stats_t s = c.snapshot();
  k.mem_alloc = s.mem_alloc;
  k.mem_free = s.mem_free;
  k.alloc_async = s.mem_alloc_async;
  k.free_async = s.mem_free_async;
  k.ctx_events = c.call_count("cuCtxRecordEvent");
  k.event_records = c.call_count("cuEventRecord");
  k.event_queries = c.call_count("cuEventQuery");
  k.event_syncs = c.call_count("cuEventSynchronize");
  k.stream_waits = c.call_count("cuStreamWaitEvent");
  k.locked_allocs = stat("num_locked_allocs");
  k.locked_frees = stat("num_locked_frees");
  k.bridges = stat("num_bridged_allocs");
  k.segments = stat("segment.all.current");
  k.reserved = stat("reserved_bytes.all.current");
  k.device_allocs = stat("num_device_alloc");
  k.hits = stat("num_cache_hits");
  k.misses = stat("num_cache_misses");
  return k;
}

// The calls made between `a` and `b`; segments and reserved bytes as they stand at `b`.
void print(const std::string& head, const Counts& a, const Counts& b, double ns, long pairs) {
  std::printf("%s pairs=%ld ns_per_pair=%.0f driver_alloc=%llu driver_free=%llu driver_alloc_async=%llu "
              "driver_free_async=%llu ctx_events=%llu event_records=%llu event_queries=%llu event_syncs=%llu "
              "stream_waits=%llu locked_allocs=%lld locked_frees=%lld bridges=%lld device_allocs=%lld "
              "hits=%lld misses=%lld segments=%lld reserved_mib=%.1f\n",
              head.c_str(), pairs, pairs > 0 ? ns / static_cast<double>(pairs) : 0.0,
              static_cast<unsigned long long>(b.mem_alloc - a.mem_alloc),
              static_cast<unsigned long long>(b.mem_free - a.mem_free),
              static_cast<unsigned long long>(b.alloc_async - a.alloc_async),
              static_cast<unsigned long long>(b.free_async - a.free_async),
              static_cast<unsigned long long>(b.ctx_events - a.ctx_events),
              static_cast<unsigned long long>(b.event_records - a.event_records),
              static_cast<unsigned long long>(b.event_queries - a.event_queries),
              static_cast<unsigned long long>(b.event_syncs - a.event_syncs),
              static_cast<unsigned long long>(b.stream_waits - a.stream_waits),
              static_cast<long long>(b.locked_allocs - a.locked_allocs),
              static_cast<long long>(b.locked_frees - a.locked_frees),
              static_cast<long long>(b.bridges - a.bridges),
              static_cast<long long>(b.device_allocs - a.device_allocs), static_cast<long long>(b.hits - a.hits),
              static_cast<long long>(b.misses - a.misses), static_cast<long long>(b.segments),
              static_cast<double>(b.reserved) / (1 << 20));
}

struct Args {
  std::string mode;
  size_t size = 64 << 10;
  long pairs = 2000;
  long warm = 10;
  long live = 1000;
  long ops = 20000;
  int threads = 8;
  bool async = false;
  bool runs = false;
  std::string stream = "blocking";
};

CUdeviceptr one_alloc(size_t size, bool async, CUstream s) {
  auto& c = client::client();
  CUdeviceptr p = 0;
  const CUresult r = async ? c.api.cuMemAllocAsync(&p, size, s) : c.api.cuMemAlloc_v2(&p, size);
  CHECK_OR_DIE(r == CUDA_SUCCESS);
  return p;
}

void one_free(CUdeviceptr p, bool async, CUstream s) {
  auto& c = client::client();
  CHECK_OR_DIE((async ? c.api.cuMemFreeAsync(p, s) : c.api.cuMemFree_v2(p)) == CUDA_SUCCESS);
}

CUstream make_stream(const std::string& kind) {
  auto& c = client::client();
  CUstream s = nullptr;
  if (kind == "blocking") CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
  if (kind == "nonblocking") CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  return s;
}

// The loop of one size: warm-up, then checkpoints of the counted pairs.
void pairs_of(const Args& a, size_t size, CUstream s) {
  const bool async = a.async;
  std::unordered_set<CUdeviceptr> seen;
  long first_reuse = 0;
  long n = 0;
  // --runs: the pairs (numbered from the first warm-up pair) whose allocation took the device
  // lock, as runs "first-last"; reading the statistic takes the lock, so only with --runs.
  std::string runs;
  long run_start = 0, run_end = 0;
  auto close_run = [&] {
    if (run_start != 0) runs += (runs.empty() ? "" : ",") + std::to_string(run_start) + "-" + std::to_string(run_end);
    run_start = 0;
  };
  int64_t locked_before = a.runs ? stat("num_locked_allocs") : 0;
  auto pair = [&] {
    const CUdeviceptr p = one_alloc(size, async, s);
    ++n;
    if (first_reuse == 0 && !seen.insert(p).second) first_reuse = n;
    one_free(p, async, s);
    if (!a.runs) return;
    const int64_t locked = stat("num_locked_allocs");
    if (locked != locked_before) {
      if (run_start == 0) run_start = n;
      run_end = n;
    } else if (run_start != 0 && n - run_end > 0) {
      close_run();
    }
    locked_before = locked;
  };
  char head[160];
  Counts k0 = now();
  auto t0 = Clock::now();
  for (long i = 0; i < a.warm; ++i) pair();

  double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  std::snprintf(head, sizeof head, "counts size=%zu async=%d phase=warm", size, async ? 1 : 0);
  print(head, k0, now(), ns, a.warm);
  const Counts start = now();
  Counts k = start;
  long done = 0;
  double total_ns = 0;
  for (long mark : {10L, 100L, 256L, 500L, 1000L, 2000L, 5000L, 20000L}) {
    const long upto = std::min(mark, a.pairs);
    if (upto <= done) continue;
    const long from = done;
    t0 = Clock::now();
    for (; done < upto; ++done) pair();
    ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    total_ns += ns;
    const Counts k2 = now();
    std::snprintf(head, sizeof head, "counts size=%zu async=%d phase=upto%ld", size, async ? 1 : 0, upto);
    print(head, k, k2, ns, upto - from);
    k = k2;
  }
  std::snprintf(head, sizeof head, "counts size=%zu async=%d phase=all first_reuse=%ld distinct=%zu", size,
                async ? 1 : 0, first_reuse, seen.size());
  print(head, start, now(), total_ns, a.pairs);
  if (a.runs) {
    close_run();
    std::printf("locked_runs size=%zu async=%d %s\n", size, async ? 1 : 0, runs.c_str());
  }
}

void mix(const Args& a) {
  CUstream s = a.async ? make_stream("nonblocking") : make_stream(a.stream);
  bench::RandomMix<CUdeviceptr> mix(static_cast<size_t>(a.live));
  auto take = [&](size_t n) { return one_alloc(n, a.async, s); };
  auto give = [&](CUdeviceptr p) { one_free(p, a.async, s); };
  char head[128];
  Counts k0 = now();
  auto t0 = Clock::now();
  mix.fill(take);
  double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  std::snprintf(head, sizeof head, "mix live=%ld async=%d phase=fill", a.live, a.async ? 1 : 0);
  print(head, k0, now(), ns, a.live);  // "pairs" here counts operations
  k0 = now();
  t0 = Clock::now();
  for (long i = 0; i < a.ops; ++i) mix.step(take, give);
  ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  std::snprintf(head, sizeof head, "mix live=%ld async=%d phase=ops", a.live, a.async ? 1 : 0);
  print(head, k0, now(), ns, a.ops);
  mix.drain(give);
}

void threads(const Args& a) {
  auto& c = client::client();
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < a.threads; ++t) {
    ts.emplace_back([&] {
      CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
      ready++;
      while (!go) std::this_thread::yield();
      CUstream s = nullptr;
      CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
      for (long i = 0; i < a.pairs; ++i) one_free(one_alloc(a.size, false, s), false, s);
      CHECK_OR_DIE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
    });
  }
  while (ready < a.threads) std::this_thread::yield();
  const Counts k0 = now();
  const auto t0 = Clock::now();
  go = true;
  for (auto& t : ts) t.join();
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  char head[128];
  std::snprintf(head, sizeof head, "threads threads=%d size=%zu", a.threads, a.size);
  print(head, k0, now(), ns, a.threads * a.pairs);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (argc > 1) a.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (k == "--async") a.async = true;
    else if (k == "--runs") a.runs = true;
    else if (k == "--size") a.size = std::strtoull(v, nullptr, 10), ++i;
    else if (k == "--pairs") a.pairs = std::atol(v), ++i;
    else if (k == "--warm") a.warm = std::atol(v), ++i;
    else if (k == "--live") a.live = std::atol(v), ++i;
    else if (k == "--ops") a.ops = std::atol(v), ++i;
    else if (k == "--threads") a.threads = std::atoi(v), ++i;
    else if (k == "--stream") a.stream = v, ++i;
  }
  client::client();
  if (stat_fn() == nullptr) client::die("cudalloc_stat not found: run with LD_PRELOAD=libcudalloc.so");
  if (a.mode == "pairs") {
    CUstream s = a.async ? make_stream("nonblocking") : make_stream(a.stream);
    pairs_of(a, a.size, s);
  } else if (a.mode == "sweep") {
    CUstream s = a.async ? make_stream("nonblocking") : make_stream(a.stream);
    for (size_t size = 512; size <= (size_t{1} << 30); size *= 4) pairs_of(a, size, s);
  } else if (a.mode == "mix") {
    mix(a);
  } else if (a.mode == "threads") {
    threads(a);
  } else {
    std::fprintf(stderr, "usage: shim_counts pairs|sweep|mix|threads [options] (see the file's header)\n");
    return 2;
  }
  return 0;
}
