// CUDALLOC_SANITIZER=nvtx over the fake driver, with the fake NVTX injection standing in for
// compute-sanitizer (run with NV_SANITIZER_*, NVTX_INJECTION64_PATH and a memory limit; see
// meson.build): caching stays on, every live block is a region of its requested size inside a
// registered heap, frees unregister, a block handed out again is registered with its new size,
// and segments released under memory pressure have their heaps unregistered.
//   nvtx_check          all of that
//   nvtx_check order    only that each heap is unregistered before its segment's driver free
//   nvtx_check reset    (FAKE_CUDA_DEVICES=2) a context reset with blocks live and cached
//                       unregisters its heaps and regions at once
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "client.h"
#include "fake_nvtx.h"

namespace {

struct Injection {
  fake_nvtx_region_fn region = nullptr;
  fake_nvtx_stats_fn stats = nullptr;
  fake_nvtx_first_error_fn first_error = nullptr;
  fake_nvtx_stats_t snapshot() const {
    fake_nvtx_stats_t s{};
    stats(&s);
    return s;
  }
};

// Loaded by NVTX at cudalloc's first segment: call after an allocation.
const Injection& injection() {
  static Injection* inj = [] {
    const char* path = std::getenv("NVTX_INJECTION64_PATH");
    if (path == nullptr) client::die("NVTX_INJECTION64_PATH unset");
    void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) client::die("the NVTX injection was never loaded: cudalloc made no NVTX call");
    auto* i = new Injection;
    i->region = reinterpret_cast<fake_nvtx_region_fn>(dlsym(h, "fake_nvtx_region"));
    i->stats = reinterpret_cast<fake_nvtx_stats_fn>(dlsym(h, "fake_nvtx_stats"));
    i->first_error = reinterpret_cast<fake_nvtx_first_error_fn>(dlsym(h, "fake_nvtx_first_error"));
    if (!i->region || !i->stats || !i->first_error) client::die("fake NVTX controls");
    return i;
  }();
  return *inj;
}

bool has_region(CUdeviceptr p, size_t requested) {
  size_t size = 0, heap_size = 0;
  uintptr_t heap = 0;
  if (!injection().region(static_cast<uintptr_t>(p), &size, &heap, &heap_size)) return false;
  return size == requested && heap <= p && p + requested <= heap + heap_size;
}

bool no_region(CUdeviceptr p) {
  size_t size = 0, heap_size = 0;
  uintptr_t heap = 0;
  return !injection().region(static_cast<uintptr_t>(p), &size, &heap, &heap_size);
}

void check_no_errors() {
  const fake_nvtx_stats_t s = injection().snapshot();
  if (s.errors != 0) client::die(std::string("the NVTX tool saw a bad call: ") + injection().first_error());
}

struct Live {
  CUdeviceptr p;
  size_t n;
  CUstream s = nullptr;  // cudaMallocAsync'd on it; null: cudaMalloc
};

// Device 1's primary context is reset (cudaDeviceReset) with blocks live and cached: the
// memory went with it, so its heaps and regions must go then, not when a later segment happens
// to overlap them (memcheck would take memory placed there by another allocator for cudalloc's).
int reset_unregisters(client::Client& c) {
  CUcontext ctx1 = nullptr;
  CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&ctx1, 1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  std::vector<Live> live;
  for (size_t n : {size_t{100}, size_t{70000}, (size_t{3} << 20) + 5, size_t{25} << 20}) {
    CUdeviceptr p = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    CHECK_OR_DIE(has_region(p, n));
    live.push_back({p, n});
  }
  CHECK_OR_DIE(c.api.cuMemFree_v2(live.back().p) == CUDA_SUCCESS);  // cached
  const fake_nvtx_stats_t before = injection().snapshot();
  CHECK_OR_DIE(c.api.cuDevicePrimaryCtxReset_v2(1) == CUDA_SUCCESS);
  const fake_nvtx_stats_t after = injection().snapshot();
  std::fprintf(stderr, "reset: heaps live %llu -> %llu, regions live %llu -> %llu\n",
               (unsigned long long)before.heaps_live, (unsigned long long)after.heaps_live,
               (unsigned long long)before.regions_live, (unsigned long long)after.regions_live);
  check_no_errors();
  CHECK_OR_DIE(before.heaps_live >= 2 && before.regions_live == live.size() - 1);
  CHECK_OR_DIE(after.heaps_live == 0 && after.regions_live == 0);
  // Device 0 goes on registering as before.
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 4000) == CUDA_SUCCESS);
  CHECK_OR_DIE(has_region(p, 4000));
  check_no_errors();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool order_only = argc > 1 && std::strcmp(argv[1], "order") == 0;
  client::Client& c = client::client();
  if (argc > 1 && std::strcmp(argv[1], "reset") == 0) return reset_unregisters(c);
  c.reset_stats();
  size_t program_allocs = 0;
  auto alloc = [&](size_t n) {
    CUdeviceptr p = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    ++program_allocs;
    return Live{p, n};
  };

  // 1. Both pools and oversize blocks: each a region of exactly the requested size.
  std::vector<Live> live;
  for (size_t n : {size_t{1}, size_t{100}, size_t{4000}, size_t{4096}, size_t{70000}, (size_t{1} << 20) - 3,
                   (size_t{3} << 20) + 5, (size_t{12} << 20) + 1, size_t{25} << 20, size_t{40} << 20}) {
    live.push_back(alloc(n));
    CHECK_OR_DIE(has_region(live.back().p, n));
  }
  const fake_nvtx_stats_t first = injection().snapshot();
  CHECK_OR_DIE(first.core_inits == 1 && first.mem_inits == 1 && first.domains_cudalloc == 1);
  CHECK_OR_DIE(first.heaps_live >= 3);

  // 2. A free unregisters at once, while the memory stays cached.
  for (size_t i = 0; i < live.size(); i += 2) {
    CHECK_OR_DIE(c.api.cuMemFree_v2(live[i].p) == CUDA_SUCCESS);
    CHECK_OR_DIE(no_region(live[i].p));
  }
  std::vector<Live> kept;
  for (size_t i = 1; i < live.size(); i += 2) kept.push_back(live[i]);
  CHECK_OR_DIE(c.snapshot().mem_free == 0);

  if (!order_only) {
    // 3. A block freed and handed out again (same stream: at once, from the thread cache) is
    //    registered with the new, smaller request, so a write past it is still caught.
    CUstream s = nullptr;
    CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    int reused = 0;
    for (int i = 0; i < 20; ++i) {
      CUdeviceptr p1 = 0, p2 = 0;
      CHECK_OR_DIE(c.api.cuMemAllocAsync(&p1, 4096, s) == CUDA_SUCCESS);
      CHECK_OR_DIE(has_region(p1, 4096));
      CHECK_OR_DIE(c.api.cuMemFreeAsync(p1, s) == CUDA_SUCCESS);
      CHECK_OR_DIE(no_region(p1));
      CHECK_OR_DIE(c.api.cuMemAllocAsync(&p2, 3900, s) == CUDA_SUCCESS);
      CHECK_OR_DIE(has_region(p2, 3900));
      reused += p2 == p1;
      CHECK_OR_DIE(c.api.cuMemFreeAsync(p2, s) == CUDA_SUCCESS);
      program_allocs += 2;
    }
    CHECK_OR_DIE(reused > 0);
    CHECK_OR_DIE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);

    // 4. cudaMalloc/cudaFree in a loop with changing sizes.
    for (int i = 0; i < 300; ++i) {
      const Live b = alloc(512 + static_cast<size_t>(i % 7) * 1000);
      CHECK_OR_DIE(has_region(b.p, b.n));
      CHECK_OR_DIE(c.api.cuMemFree_v2(b.p) == CUDA_SUCCESS);
    }

    // 5. Threads on the thread caches and the locked path at once (the observer is called
    //    from both, and stream-ordered frees are reusable at once, so blocks move between
    //    threads quickly): a block is registered with its size whenever its owner looks.
    std::atomic<int> bad{0};
    std::atomic<size_t> made{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        c.api.cuCtxSetCurrent(c.ctx);
        CUstream mine_stream = nullptr;
        if (c.api.cuStreamCreate(&mine_stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) ++bad;
        std::mt19937 rng(1234 + t);
        std::vector<Live> mine;
        auto release = [&](const Live& b) {
          const CUresult r = b.s != nullptr ? c.api.cuMemFreeAsync(b.p, b.s) : c.api.cuMemFree_v2(b.p);
          if (r != CUDA_SUCCESS) ++bad;
        };
        for (int i = 0; i < 3000; ++i) {
          if (mine.size() < 16 && (mine.empty() || rng() % 2 == 0)) {
            const size_t n = rng() % 16 == 0 ? (1u << 20) + rng() % (2u << 20) : 1 + rng() % 65536;
            const CUstream s = rng() % 2 == 0 ? mine_stream : nullptr;
            CUdeviceptr p = 0;
            const CUresult r = s != nullptr ? c.api.cuMemAllocAsync(&p, n, s) : c.api.cuMemAlloc_v2(&p, n);
            if (r != CUDA_SUCCESS) {
              ++bad;
              continue;
            }
            ++made;
            if (!has_region(p, n)) ++bad;
            mine.push_back({p, n, s});
          } else {
            const size_t k = rng() % mine.size();
            if (!has_region(mine[k].p, mine[k].n)) ++bad;
            release(mine[k]);
            mine[k] = mine.back();
            mine.pop_back();
          }
        }
        for (const Live& b : mine) release(b);
        if (c.api.cuStreamSynchronize(mine_stream) != CUDA_SUCCESS) ++bad;
      });
    }
    for (auto& t : threads) t.join();
    CHECK_OR_DIE(bad.load() == 0);
    program_allocs += made.load();
    check_no_errors();
    CHECK_OR_DIE(injection().snapshot().regions_live == kept.size());
    for (const Live& b : kept) CHECK_OR_DIE(has_region(b.p, b.n));

    // Served from the cache: the driver made a small fraction of the allocations.
    const auto d = c.snapshot();
    std::fprintf(stderr, "program allocations %zu, driver allocations %llu\n", program_allocs,
                 static_cast<unsigned long long>(d.mem_alloc));
    CHECK_OR_DIE(d.mem_alloc * 20 < program_allocs);
  }

  // 6. Memory pressure (CUDALLOC_CONF sets a limit): everything is freed, then a block too
  //    large for the limit with the cache full makes cudalloc release idle segments.
  for (const Live& b : kept) CHECK_OR_DIE(c.api.cuMemFree_v2(b.p) == CUDA_SUCCESS);
  const Live big = alloc(size_t{200} << 20);
  CHECK_OR_DIE(has_region(big.p, big.n));
  const fake_nvtx_stats_t end = injection().snapshot();
  const auto d = c.snapshot();
  std::fprintf(stderr,
               "heaps registered %llu, unregistered %llu, late %llu; regions registered %llu, unregistered %llu; "
               "driver frees %llu\n",
               (unsigned long long)end.heaps_registered, (unsigned long long)end.heaps_unregistered,
               (unsigned long long)end.late_heap_unregisters, (unsigned long long)end.regions_registered,
               (unsigned long long)end.regions_unregistered, (unsigned long long)d.mem_free);
  check_no_errors();
  CHECK_OR_DIE(d.mem_free > 0);
  CHECK_OR_DIE(end.heaps_unregistered == d.mem_free);  // every segment given back was unregistered
  CHECK_OR_DIE(end.heaps_live == end.heaps_registered - end.heaps_unregistered);
  CHECK_OR_DIE(end.regions_live == 1);
  if (order_only) {
    // The heap must go before the memory under it: otherwise the tool briefly describes
    // memory the driver may already have handed to someone else.
    CHECK_OR_DIE(end.late_heap_unregisters == 0);
  }
  CHECK_OR_DIE(c.api.cuMemFree_v2(big.p) == CUDA_SUCCESS);
  CHECK_OR_DIE(no_region(big.p));
  return 0;
}
