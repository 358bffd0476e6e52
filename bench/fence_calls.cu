// What the driver calls behind a device fence cost, from 1 and from T threads at once: the
// calls cudalloc makes to fence a batch of cudaFree'd blocks (FenceClock, fence_clock.h).
//   fence_calls [--threads T] [--iters N]
// Each thread owns a non-blocking stream, as bench_pairs' threads do, and times, in turn:
//   stream_query   cuStreamQuery of its idle stream (how a fence skips an idle stream)
//   record_legacy  cuEventRecord on the legacy stream (the fence's event)
//   record_own     cuEventRecord on its own stream
//   event_query    cuEventQuery of an event that has completed
//   ctx_current    cuCtxGetCurrent (cudaMalloc's hot path asks it once a pair)
//   record_ctx     cuCtxRecordEvent of the context (one event for all its streams' work)
// and prints the median and p99 per call, all threads' timings together.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

using Clock = std::chrono::steady_clock;

namespace {

constexpr int kWindow = 16;  // calls per timing, so the clock's own cost is not counted
enum Call { kStreamQuery, kRecordLegacy, kRecordOwn, kEventQuery, kCtxCurrent, kRecordCtx, kCalls };
const char* kNames[kCalls] = {"stream_query", "record_legacy", "record_own", "event_query", "ctx_current", "record_ctx"};

struct Timings {
  std::vector<double> ns[kCalls];
};

void run_thread(CUcontext ctx, int iters, std::atomic<int>* ready, std::atomic<bool>* go, Timings* out) {
  CHECK_CU(cuCtxSetCurrent(ctx));
  CUstream s = nullptr;
  CHECK_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<CUevent> events(kWindow);
  for (CUevent& e : events) CHECK_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CUevent done = nullptr;
  CHECK_CU(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  CHECK_CU(cuEventRecord(done, s));
  CHECK_CU(cuEventSynchronize(done));
  ready->fetch_add(1);
  while (!go->load()) std::this_thread::yield();
  for (int it = 0; it < iters / kWindow; ++it) {
    for (int c = 0; c < kCalls; ++c) {
      const auto t0 = Clock::now();
      for (int i = 0; i < kWindow; ++i) {
        switch (c) {
          case kStreamQuery: cuStreamQuery(s); break;
          case kRecordLegacy: cuEventRecord(events[i], CU_STREAM_LEGACY); break;
          case kRecordOwn: cuEventRecord(events[i], s); break;
          case kEventQuery: cuEventQuery(done); break;
          case kCtxCurrent: {
            CUcontext cur = nullptr;
            cuCtxGetCurrent(&cur);
            break;
          }
          case kRecordCtx: cuCtxRecordEvent(ctx, events[i]); break;
        }
      }
      out->ns[c].push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kWindow);
    }
  }
  CHECK_CU(cuStreamSynchronize(s));
  CHECK_CU(cuCtxSynchronize());
  for (CUevent e : events) cuEventDestroy(e);
  cuEventDestroy(done);
  cuStreamDestroy(s);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, iters = 20000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
  }
  CHECK_CU(cuInit(0));
  CUdevice dev = 0;
  CHECK_CU(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  std::vector<Timings> timings(threads);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(run_thread, ctx, iters, &ready, &go, &timings[t]);
  while (ready.load() < threads) std::this_thread::yield();
  go = true;
  for (auto& t : ts) t.join();
  for (int c = 0; c < kCalls; ++c) {
    std::vector<double> all;
    for (const Timings& t : timings) all.insert(all.end(), t.ns[c].begin(), t.ns[c].end());
    std::sort(all.begin(), all.end());
    std::printf("fence_calls threads=%d call=%s median_ns=%.0f p99_ns=%.0f\n", threads, kNames[c], all[all.size() / 2],
                all[static_cast<size_t>(all.size() * 0.99)]);
  }
  cuDevicePrimaryCtxRelease(dev);
  return 0;
}
