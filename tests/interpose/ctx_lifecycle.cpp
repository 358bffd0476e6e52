// Context lifecycle with several contexts and devices, one scenario per process (argv[1]); run
// with 2 fake devices. Each fails under cudalloc as it was before the fix named in it, and
// passes without the preload (but the limit_* scenarios, whose limit is cudalloc's own).
//   destroy_primary   cuCtxDestroy of a primary context is refused: its blocks stay cudalloc's
//   getinfo_two_ctx   cuMemGetInfo counts the idle cached bytes of every context on the device
//   capture_reset     a device reset mid-capture ends the capture for cudalloc too
//   release_race      a primary context released to zero while another thread retains it:
//                     the new life never gets the old life's blocks
//   stale_stream      cudaMallocAsync on a stream of a destroyed context is the driver's error,
//                     not memory of the current context
//   limit_two_ctx     (CUDALLOC_CONF=memory_limit_mb:64) the limit bounds the process: two
//                     contexts on one device share it, and a destroyed context's memory frees it
//   limit_capture     (CUDALLOC_CONF=memory_limit_mb:64) a segment given back during a stream
//                     capture, whose cuMemFree waits for the capture's end, keeps its room
//                     under the limit until then
//   limit_capture_reset  (the same limit) such a segment's room comes back when its context is
//                     reset before the capture's end
//   limit_capture_getinfo  (the same limit) cuMemGetInfo during the capture counts such a
//                     segment as in use: a request of the free bytes it reports is served
//   limit_capture_refused  (the same limit) such a segment whose cuMemFree the driver refuses
//                     after the capture goes back to the cache: it serves, or is freed, later
//   reclaim_two_ctx   a request the device cannot serve while another context of it holds the
//                     memory idle in its cache gets that memory
//   reclaim_fails     a request no release can make room for fails, after the other context's
//                     idle cache was released (run by check_process.py oom_records: the failure
//                     is one OOM in the trace and the statistics, and reclaim_two_ctx's success none)
//   forget_traced reset|destroy   a context of device 1 (its primary context, reset; or one of
//                     cuCtxCreate, destroyed) goes with blocks live and cached (run by
//                     check_process.py forgotten: the trace says they all went, totals at zero)
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "client.h"

using client::Client;
using client::proc;
using CtxCreateFn = CUresult (*)(CUcontext*, unsigned, CUdevice);
using CtxDestroyFn = CUresult (*)(CUcontext);
using CtxPopFn = CUresult (*)(CUcontext*);
constexpr std::size_t MiB = 1 << 20;

// A short busy wait the compiler keeps (a window for the other thread's calls).
static void spin(int n) {
  for (int k = 0; k < n; ++k) asm volatile("" ::: "memory");
}

static bool usable(Client& c, CUdeviceptr p, std::size_t n) {
  std::vector<unsigned char> h(n, 0x5A);
  return c.api.cuMemcpyHtoD_v2(p, h.data(), n) == CUDA_SUCCESS;
}

// A second context of device 0 allocates and frees `bytes`, which stay idle in its cache; the
// primary context is current again afterwards.
static void cached_in_other_context(Client& c, std::size_t bytes) {
  auto create = proc<CtxCreateFn>(c, "cuCtxCreate", 3020);
  auto pop = proc<CtxPopFn>(c, "cuCtxPopCurrent", 4000);
  CUcontext other = nullptr;
  CHECK_OR_DIE(create(&other, 0, 0) == CUDA_SUCCESS);  // device 0, pushed
  CUdeviceptr a = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&a, bytes) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(a) == CUDA_SUCCESS);
  CUcontext popped = nullptr;
  CHECK_OR_DIE(pop(&popped) == CUDA_SUCCESS);  // the primary context, same device
}

// `bytes` allocated and freed on `s`, so that they lie idle in the cache as a segment of their
// own (a stream-ordered free on the block's own stream needs no fence).
static void idle_segment_on(Client& c, CUstream s, std::size_t bytes) {
  CUdeviceptr a = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&a, bytes, s) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFreeAsync(a, s) == CUDA_SUCCESS);
}

// Under memory_limit_mb:64: 40 MiB idle in the cache on a new stream, a relaxed capture begun
// on it, then a 50 MiB cuMemAlloc (its result in *over): it gives the 40 MiB segment back, and
// the segment's cuMemFree is parked until the capture's end. Returns the capturing stream.
static CUstream parked_in_capture(Client& c, CUresult* over) {
  CUstream s = nullptr;
  CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  idle_segment_on(c, s, 40 * MiB);
  CHECK_OR_DIE(c.api.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CUdeviceptr b = 0;
  *over = c.api.cuMemAlloc_v2(&b, 50 * MiB);
  return s;
}

// Blocks live and cached in the current context: cudaMalloc'd and stream-ordered, small and
// large, live; freed into the thread's cache, behind a device fence, and a whole idle segment.
static void live_and_cached(Client& c, CUstream s) {
  CUdeviceptr p = 0;
  for (std::size_t n : {std::size_t{1000}, 30 * MiB}) CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
  for (std::size_t n : {std::size_t{3000}, 5 * MiB}) CHECK_OR_DIE(c.api.cuMemAllocAsync(&p, n, s) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&p, 4000, s) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 2000) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  idle_segment_on(c, s, 40 * MiB);
}

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  Client& c = client::client();

  if (what == "destroy_primary") {
    // cuCtxDestroy on a primary context is refused by the driver; nothing must change.
    auto destroy = proc<CtxDestroyFn>(c, "cuCtxDestroy", 4000);
    CUdeviceptr a = 0, b = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&a, 1024) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&b, 1024) == CUDA_SUCCESS);
    const CUresult rd = destroy(c.ctx);
    const CUresult rf = c.api.cuMemFree_v2(b);
    const bool ok_a = usable(c, a, 1024);
    std::fprintf(stderr, "destroy_primary: cuCtxDestroy(primary)=%d, then cuMemFree(b)=%d, a usable=%d\n", rd, rf,
                 ok_a);
    return (rd != CUDA_SUCCESS && rf != CUDA_SUCCESS) ? 1 : 0;
  }

  if (what == "getinfo_two_ctx") {
    auto create = proc<CtxCreateFn>(c, "cuCtxCreate", 3020);
    auto pop = proc<CtxPopFn>(c, "cuCtxPopCurrent", 4000);
    std::size_t f0 = 0, t0 = 0, f1 = 0, t1 = 0, fc = 0, tc = 0;
    CHECK_OR_DIE(c.api.cuMemGetInfo_v2(&f0, &t0) == CUDA_SUCCESS);
    CUcontext other = nullptr;
    CHECK_OR_DIE(create(&other, 0, 0) == CUDA_SUCCESS);  // device 0, pushed
    CUdeviceptr p = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 512 * MiB) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuMemGetInfo_v2(&fc, &tc) == CUDA_SUCCESS);
    CUcontext popped = nullptr;
    CHECK_OR_DIE(pop(&popped) == CUDA_SUCCESS);  // back to the primary context, same device
    CHECK_OR_DIE(c.api.cuMemGetInfo_v2(&f1, &t1) == CUDA_SUCCESS);
    std::fprintf(stderr, "getinfo_two_ctx: free before %zu MiB; in the other ctx after its free %zu MiB; "
                 "in the primary ctx %zu MiB\n", f0 / MiB, fc / MiB, f1 / MiB);
    return f1 + 64 * MiB < f0 ? 1 : 0;
  }

  if (what == "limit_two_ctx") {
    auto create = proc<CtxCreateFn>(c, "cuCtxCreate", 3020);
    auto destroy = proc<CtxDestroyFn>(c, "cuCtxDestroy", 4000);
    auto pop = proc<CtxPopFn>(c, "cuCtxPopCurrent", 4000);
    CUcontext other = nullptr;
    CHECK_OR_DIE(create(&other, 0, 0) == CUDA_SUCCESS);  // device 0, pushed
    CUdeviceptr a = 0, b = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&a, 40 * MiB) == CUDA_SUCCESS);
    CUcontext popped = nullptr;
    CHECK_OR_DIE(pop(&popped) == CUDA_SUCCESS);  // the primary context, same device
    const CUresult over = c.api.cuMemAlloc_v2(&b, 40 * MiB);  // 80 MiB in all: past the limit
    std::size_t free_bytes = 0, total_bytes = 0;
    CHECK_OR_DIE(c.api.cuMemGetInfo_v2(&free_bytes, &total_bytes) == CUDA_SUCCESS);
    CHECK_OR_DIE(destroy(other) == CUDA_SUCCESS);  // its 40 MiB go with it
    CUdeviceptr d = 0;
    const CUresult after = c.api.cuMemAlloc_v2(&d, 40 * MiB);
    std::fprintf(stderr, "limit_two_ctx: second context's 40 MiB, then the primary's: %d (want %d); "
                 "cuMemGetInfo there: free %zu of %zu MiB; after the other's end: %d\n",
                 over, CUDA_ERROR_OUT_OF_MEMORY, free_bytes / MiB, total_bytes / MiB, after);
    const bool ok = over == CUDA_ERROR_OUT_OF_MEMORY && total_bytes == 64 * MiB && free_bytes <= 24 * MiB &&
                    after == CUDA_SUCCESS && usable(c, d, 40 * MiB);
    return ok ? 0 : 1;
  }

  if (what == "limit_capture") {  // memory_limit_mb:64
    CUstream s = nullptr;
    CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    idle_segment_on(c, s, 40 * MiB);
    c.reset_stats();  // the peak from here
    CHECK_OR_DIE(c.api.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    // The 40 MiB segment goes back to make room, but its cuMemFree must wait for the capture.
    CUdeviceptr b = 0;
    const CUresult during = c.api.cuMemAlloc_v2(&b, 50 * MiB);
    const std::size_t peak = c.snapshot().peak_bytes_in_use;
    CUgraph graph = nullptr;
    CHECK_OR_DIE(c.api.cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
    if (during == CUDA_SUCCESS) CHECK_OR_DIE(c.api.cuMemFree_v2(b) == CUDA_SUCCESS);
    CUdeviceptr d = 0;
    const CUresult after = c.api.cuMemAlloc_v2(&d, 50 * MiB);  // the capture is over: freed now
    std::fprintf(stderr, "limit_capture: 50 MiB during the capture: %d (want %d), device memory at most %zu MiB; "
                 "after its end: %d\n", during, CUDA_ERROR_OUT_OF_MEMORY, std::size_t(peak / MiB), after);
    return during == CUDA_ERROR_OUT_OF_MEMORY && peak <= 64 * MiB && after == CUDA_SUCCESS && usable(c, d, 50 * MiB)
               ? 0 : 1;
  }

  if (what == "limit_capture_reset") {  // memory_limit_mb:64, FAKE_CUDA_DEVICES=2: device 1
    CUcontext ctx1 = nullptr;
    CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&ctx1, 1) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
    CUresult during = CUDA_SUCCESS;
    parked_in_capture(c, &during);
    // cudaDeviceReset mid-capture: the context takes its memory, parked or not, with it.
    CHECK_OR_DIE(c.api.cuDevicePrimaryCtxReset_v2(1) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&ctx1, 1) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
    CUdeviceptr d = 0;
    const CUresult after = c.api.cuMemAlloc_v2(&d, 60 * MiB);
    std::fprintf(stderr, "limit_capture_reset: 50 MiB during the capture: %d; 60 MiB after the reset: %d\n",
                 during, after);
    return after == CUDA_SUCCESS && usable(c, d, 60 * MiB) ? 0 : 1;
  }

  if (what == "forget_traced") {  // FAKE_CUDA_DEVICES=2
    const std::string how = argc > 2 ? argv[2] : "";
    auto create = proc<CtxCreateFn>(c, "cuCtxCreate", 3020);
    auto destroy = proc<CtxDestroyFn>(c, "cuCtxDestroy", 4000);
    CUcontext ctx1 = nullptr;
    if (how == "destroy") {
      CHECK_OR_DIE(create(&ctx1, 0, 1) == CUDA_SUCCESS);  // device 1, pushed
    } else {
      CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&ctx1, 1) == CUDA_SUCCESS);
      CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
    }
    CUstream s = nullptr;
    CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    live_and_cached(c, s);
    if (how == "destroy") {
      CHECK_OR_DIE(destroy(ctx1) == CUDA_SUCCESS);
    } else {
      CHECK_OR_DIE(c.api.cuDevicePrimaryCtxReset_v2(1) == CUDA_SUCCESS);
    }
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 1 * MiB) == CUDA_SUCCESS);  // device 0 carries on
    std::fprintf(stderr, "forget_traced %s: device 1's context went with 4 live blocks\n", how.c_str());
    return 0;
  }

  if (what == "limit_capture_getinfo") {  // memory_limit_mb:64
    CUresult over = CUDA_SUCCESS;
    const CUstream s = parked_in_capture(c, &over);
    CUdeviceptr b = 0;
    std::size_t during = 0, total = 0;
    CHECK_OR_DIE(c.api.cuMemGetInfo_v2(&during, &total) == CUDA_SUCCESS);
    // What it reports free, a request gets.
    const CUresult got = c.api.cuMemAlloc_v2(&b, during);
    CUgraph graph = nullptr;
    CHECK_OR_DIE(c.api.cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
    if (got == CUDA_SUCCESS) CHECK_OR_DIE(c.api.cuMemFree_v2(b) == CUDA_SUCCESS);
    std::size_t after = 0;
    CHECK_OR_DIE(c.api.cuMemGetInfo_v2(&after, &total) == CUDA_SUCCESS);
    std::fprintf(stderr, "limit_capture_getinfo: 50 MiB during the capture: %d; cuMemGetInfo then: free %zu MiB "
                 "of %zu, and a request of that much: %d; after the capture's end: free %zu MiB\n",
                 over, during / MiB, total / MiB, got, after / MiB);
    return over == CUDA_ERROR_OUT_OF_MEMORY && during <= 24 * MiB && got == CUDA_SUCCESS && after == 64 * MiB
               ? 0 : 1;
  }

  if (what == "limit_capture_refused") {  // memory_limit_mb:64
    CUmemoryPool pool = nullptr;
    const client::PFN_trim trim = client::default_pool_trim(c, &pool);
    CHECK_OR_DIE(trim != nullptr);
    CUresult during = CUDA_SUCCESS;
    const CUstream s = parked_in_capture(c, &during);
    c.fail_next("cuMemFree", 0, CUDA_ERROR_UNKNOWN);  // the parked free, at the capture's end
    CUgraph graph = nullptr;
    CHECK_OR_DIE(c.api.cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
    const std::size_t frees = c.call_count("cuMemFree");
    // The 40 MiB are still the device's: the cache must have them back, to serve or to free.
    CUdeviceptr d = 0;
    const CUresult after = c.api.cuMemAlloc_v2(&d, 50 * MiB);
    const std::size_t peak = c.snapshot().peak_bytes_in_use;
    if (after == CUDA_SUCCESS) CHECK_OR_DIE(usable(c, d, 50 * MiB) && c.api.cuMemFree_v2(d) == CUDA_SUCCESS);
    CHECK_OR_DIE(trim(pool, 0) == CUDA_SUCCESS);  // everything idle back to the driver
    const std::size_t left = c.snapshot().bytes_in_use;
    std::fprintf(stderr, "limit_capture_refused: 50 MiB during the capture: %d; cuMemFree calls by its end %zu "
                 "(the parked one refused); 50 MiB after: %d (device peak %zu MiB); held by the driver after a "
                 "trim to 0: %zu MiB\n", during, frees, after, peak / MiB, left / MiB);
    return during == CUDA_ERROR_OUT_OF_MEMORY && frees == 1 && after == CUDA_SUCCESS && peak <= 64 * MiB &&
                   left == 0
               ? 0 : 1;
  }

  if (what == "reclaim_two_ctx") {  // FAKE_CUDA_MEMORY_MB=2048
    cached_in_other_context(c, 1500 * MiB);
    CUdeviceptr b = 0;
    const CUresult r = c.api.cuMemAlloc_v2(&b, 1500 * MiB);
    std::fprintf(stderr, "reclaim_two_ctx: 1500 MiB in the primary context after the other's free: %d\n", r);
    return r == CUDA_SUCCESS && usable(c, b, 1500 * MiB) ? 0 : 1;
  }

  if (what == "reclaim_fails") {  // FAKE_CUDA_MEMORY_MB=2048
    cached_in_other_context(c, 600 * MiB);
    CUdeviceptr b = 0;
    const CUresult r = c.api.cuMemAlloc_v2(&b, 3000 * MiB);  // more than the device has
    CUdeviceptr d = 0;
    const CUresult after = c.api.cuMemAlloc_v2(&d, 1500 * MiB);  // the other's memory was given back
    std::fprintf(stderr, "reclaim_fails: 3000 MiB: %d (want %d); then 1500 MiB: %d\n", r, CUDA_ERROR_OUT_OF_MEMORY,
                 after);
    return r == CUDA_ERROR_OUT_OF_MEMORY && after == CUDA_SUCCESS ? 0 : 1;
  }

  if (what == "capture_reset") {  // FAKE_CUDA_DEVICES=2
    CUcontext ctx1 = nullptr;
    CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&ctx1, 1) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
    CUstream s = nullptr;
    CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
    // Something went wrong: the program resets device 1 (cudaDeviceReset) instead of ending it.
    CHECK_OR_DIE(c.api.cuDevicePrimaryCtxReset_v2(1) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);  // device 0 carries on
    int fails = 0;
    for (int i = 0; i < 64; ++i) {
      CUdeviceptr p = 0;
      const CUresult r = c.api.cuMemAlloc_v2(&p, 100 * MiB);
      if (r != CUDA_SUCCESS) {
        std::fprintf(stderr, "capture_reset: iteration %d: cuMemAlloc(100 MiB) = %d\n", i, r);
        ++fails;
        break;
      }
      CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
    }
    fakecuda_stats_t st = c.snapshot();
    std::fprintf(stderr, "capture_reset: device bytes in use at the end %zu MiB, fails %d\n",
                 std::size_t(st.bytes_in_use / MiB), fails);
    return fails ? 1 : 0;
  }

  if (what == "release_race") {  // FAKE_CUDA_DEVICES=2; device 1's primary context
    std::atomic<bool> stop{false};
    std::atomic<long> bad{0}, iters{0}, holds{0};
    std::thread other([&] {
      while (!stop.load()) {
        CUcontext x = nullptr;
        if (c.api.cuDevicePrimaryCtxRetain(&x, 1) != CUDA_SUCCESS) continue;
        ++holds;
        spin(2000);
        c.api.cuDevicePrimaryCtxRelease_v2(1);
        spin(200);
      }
    });
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < end && bad.load() == 0) {
      CUcontext x = nullptr;
      CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&x, 1) == CUDA_SUCCESS);
      CHECK_OR_DIE(c.api.cuCtxSetCurrent(x) == CUDA_SUCCESS);
      CUdeviceptr p = 0;
      CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
      if (!usable(c, p, 4096)) {
        ++bad;
        std::fprintf(stderr, "release_race: iteration %ld: cuMemAlloc gave 0x%llx, which the driver does not know\n",
                     iters.load(), (unsigned long long)p);
      }
      CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
      c.api.cuDevicePrimaryCtxRelease_v2(1);
      ++iters;
    }
    stop = true;
    other.join();
    std::fprintf(stderr, "release_race: %ld iterations, %ld holds by the other thread, %ld stale blocks\n",
                 iters.load(), holds.load(), bad.load());
    return bad.load() ? 1 : 0;
  }

  if (what == "stale_stream") {  // FAKE_CUDA_DEVICES=2
    auto create = proc<CtxCreateFn>(c, "cuCtxCreate", 3020);
    auto destroy = proc<CtxDestroyFn>(c, "cuCtxDestroy", 4000);
    CUcontext ctx1 = nullptr;
    CHECK_OR_DIE(create(&ctx1, 0, 1) == CUDA_SUCCESS);  // device 1, pushed
    CUstream s = nullptr;
    CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK_OR_DIE(destroy(ctx1) == CUDA_SUCCESS);  // takes its stream with it
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);  // device 0
    CUdeviceptr p = 0;
    const CUresult r = c.api.cuMemAllocAsync(&p, 1 * MiB, s);
    CUcontext pctx = nullptr;
    const CUresult ra = r == CUDA_SUCCESS
        ? c.api.cuPointerGetAttribute(&pctx, CU_POINTER_ATTRIBUTE_CONTEXT, p) : CUDA_ERROR_UNKNOWN;
    std::fprintf(stderr, "stale_stream: cuMemAllocAsync on a stream of a destroyed device-1 context = %d "
                 "(p=0x%llx, its context %p [attr %d], primary of device 0 is %p)\n",
                 r, (unsigned long long)p, (void*)pctx, ra, (void*)c.ctx);
    return r == CUDA_SUCCESS ? 1 : 0;
  }
  client::die("unknown scenario " + what);
}
