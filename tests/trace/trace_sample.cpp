// Writes a small, complete trace for the reader tests: two devices, segments, cache hits and
// misses, an OOM, async and device-wide frees, a cache release, passthrough calls, NVTX phases
// and (with --stacks N) native stacks. Prints what the allocator itself counted, as
// `key=value` lines, so the reader's summary can be checked against the truth.
//
//   trace_sample PATH [--stacks N] [--no-nvtx]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"
#include "trace/trace_writer.h"

using namespace cudalloc;

namespace {

const char* g_phase = nullptr;

std::size_t phase_hook(char* out, std::size_t cap) noexcept {
  if (g_phase == nullptr) return 0;
  std::size_t n = std::strlen(g_phase);
  if (n > cap) n = cap;
  std::memcpy(out, g_phase, n);
  return n;
}

__attribute__((noinline)) DevicePtr alloc_weights(DeviceAllocator& a, std::size_t bytes) {
  DevicePtr p = 0;
  if (a.allocate(bytes, kNoStream, &p) != Status::kOk) return 0;
  return p;
}

__attribute__((noinline)) DevicePtr alloc_activation(DeviceAllocator& a, std::size_t bytes,
                                                      StreamHandle s) {
  DevicePtr p = 0;
  if (a.allocate(bytes, s, &p, /*async=*/true) != Status::kOk) return 0;
  return p;
}

// Forwards to the writer and keeps the truth the reader's summary must find.
struct Tee final : AllocatorObserver {
  AllocatorObserver* next = nullptr;
  std::size_t peak_allocated[2] = {0, 0};
  std::size_t peak_reserved[2] = {0, 0};
  long hits = 0, misses = 0, records = 0;
  void on_event(const AllocatorEvent& e) noexcept override {
    ++records;
    if (e.device >= 0 && e.device < 2) {
      if (e.allocated_after > peak_allocated[e.device]) peak_allocated[e.device] = e.allocated_after;
      if (e.reserved_after > peak_reserved[e.device]) peak_reserved[e.device] = e.reserved_after;
    }
    if (e.kind == EventKind::kAlloc && e.result == Status::kOk) (e.cache_hit ? hits : misses)++;
    next->on_event(e);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: trace_sample PATH [--stacks N] [--no-nvtx]\n");
    return 2;
  }
  TraceOptions o;
  o.nvtx = true;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--stacks") == 0 && i + 1 < argc) o.stack_depth = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--no-nvtx") == 0) o.nvtx = false;
  }
  std::string err;
  auto w = TraceWriter::open(argv[1], o, &err);
  if (!w) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 1;
  }
  TraceWriter::set_nvtx_hook(&phase_hook);

  SimBackend sim0(SimOptions{.total_memory = 256 * kMiB, .host_memory = false});
  SimBackend sim1(SimOptions{.total_memory = 64 * kMiB, .host_memory = false});
  DeviceAllocator dev0(sim0, AllocatorOptions{}, 0);
  DeviceAllocator dev1(sim1, AllocatorOptions{}, 1);
  Tee tee;
  tee.next = w.get();
  dev0.set_observer(&tee);
  dev1.set_observer(&tee);
  const StreamHandle s = 0x7f00;

  g_phase = "setup";
  std::vector<DevicePtr> weights;
  for (int i = 0; i < 4; ++i) weights.push_back(alloc_weights(dev0, 10 * kMiB + 1000 * i));
  DevicePtr big = alloc_weights(dev0, 64 * kMiB);  // the largest allocation

  for (int step = 0; step < 3; ++step) {
    g_phase = "forward";
    std::vector<DevicePtr> acts;
    for (int i = 0; i < 20; ++i) acts.push_back(alloc_activation(dev0, 3000 + 512 * (i % 4), s));
    for (int i = 0; i < 4; ++i) acts.push_back(alloc_activation(dev0, 6 * kMiB, s));
    g_phase = "backward";
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) dev0.free(*it, FreeOrder::kStream, s, true);
    DevicePtr grad = alloc_activation(dev0, 12 * kMiB, s);
    g_phase = "optimizer";
    dev0.free(grad, FreeOrder::kCompleted, s, true);
  }
  g_phase = nullptr;
  DevicePtr fail = 0;
  const Status oom = dev0.allocate(200 * kMiB, kNoStream, &fail);  // does not fit: OOM
  dev0.free(big, FreeOrder::kDevice);
  dev0.synchronize_pending();
  dev0.release_cached();

  // Device 1, no phase: a few allocations and a passthrough pair.
  DevicePtr d1 = 0;
  dev1.allocate(1 * kMiB, 0, &d1);
  AllocatorEvent pt{};
  pt.kind = EventKind::kPassthroughAlloc;
  pt.device = 1;
  pt.stream = kNoStream;
  pt.ptr = 0x7000000000;
  pt.requested = pt.rounded = 8 * kMiB;
  pt.allocated_after = 8 * kMiB + 1 * kMiB;
  pt.reserved_after = 8 * kMiB + 2 * kMiB;
  tee.on_event(pt);
  pt.kind = EventKind::kPassthroughFree;
  pt.allocated_after = 1 * kMiB;
  pt.reserved_after = 2 * kMiB;
  tee.on_event(pt);

  std::printf("oom=%d\n", oom == Status::kOutOfMemory ? 1 : 0);
  std::printf("records=%ld\n", tee.records);
  std::printf("dev0_peak_allocated=%zu\n", tee.peak_allocated[0]);
  std::printf("dev0_peak_reserved=%zu\n", tee.peak_reserved[0]);
  std::printf("dev1_peak_allocated=%zu\n", tee.peak_allocated[1]);
  std::printf("dev1_peak_reserved=%zu\n", tee.peak_reserved[1]);
  std::printf("hits=%ld\n", tee.hits);
  std::printf("misses=%ld\n", tee.misses);
  dev0.set_observer(nullptr);
  dev1.set_observer(nullptr);
  TraceWriter::set_nvtx_hook(nullptr);
  std::printf("file=%s\n", w->file_path().c_str());
  w.reset();
  return 0;
}
