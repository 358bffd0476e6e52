// What tracing costs a cached allocate+free pair (the target: at most twice an untraced one).
// Prints ns per pair untraced, traced, traced with 8 stack frames, and the ratios. Exit status 1
// when the plain traced pair costs more than 2x (only meaningful on an optimized build on a
// quiet machine).
#include <chrono>
#include <cstdio>
#include <string>
#include <unistd.h>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"
#include "trace/trace_writer.h"

using namespace cudalloc;

namespace {

double pairs_ns(DeviceAllocator& a, int n) {
  DevicePtr p = 0;
  a.allocate(4096, 0x10, &p);  // warm the cache
  a.free(p, FreeOrder::kStream, 0x10);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    a.allocate(4096, 0x10, &p);
    a.free(p, FreeOrder::kStream, 0x10);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}

// With a writer, its background thread is paused while timing (flushed between repetitions):
// this measures what the allocating thread pays, not the formatting done on another core.
double best_of(DeviceAllocator& a, int n, int reps, TraceWriter* w = nullptr) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    if (w != nullptr) w->pause_writer_for_testing(true);
    double v = pairs_ns(a, n);
    if (w != nullptr) {
      w->pause_writer_for_testing(false);
      w->flush();
    }
    if (v < best) best = v;
  }
  return best;
}

}  // namespace

int main() {
  const int n = 200000;
  SimBackend sim(SimOptions{.total_memory = 1 * kGiB, .host_memory = false});
  DeviceAllocator alloc(sim, AllocatorOptions{});
  std::string path = "/tmp/cudalloc-bench-trace-" + std::to_string(::getpid()) + ".csv";

  double plain = best_of(alloc, n, 5);
  double traced = 0, stacks = 0;
  {
    TraceOptions o;
    o.ring_capacity = 1 << 20;  // the writer keeps up; measure the producer side
    auto w = TraceWriter::open(path, o);
    alloc.set_observer(w.get());
    traced = best_of(alloc, n, 5, w.get());
    double live = best_of(alloc, n, 5);  // the writer drains while we allocate
    std::printf("traced with the writer thread draining concurrently: %.1f ns per pair\n", live);
    alloc.set_observer(nullptr);
    std::printf("dropped: %llu of %llu\n", static_cast<unsigned long long>(w->dropped_total()),
                static_cast<unsigned long long>(w->dropped_total() + w->written_total()));
  }
  {
    TraceOptions o;
    o.ring_capacity = 1 << 20;
    o.stack_depth = 8;
    auto w = TraceWriter::open(path, o);
    alloc.set_observer(w.get());
    stacks = best_of(alloc, n / 4, 3, w.get());
    alloc.set_observer(nullptr);
  }
  ::unlink(path.c_str());
  std::printf("cached alloc+free pair: untraced %.1f ns, traced %.1f ns (%.2fx), "
              "traced with 8 frames %.1f ns (%.2fx)\n",
              plain, traced, traced / plain, stacks, stacks / plain);
  return traced <= 2.0 * plain ? 0 : 1;
}
