// The NVTX observer fed event sequences directly, the fake NVTX injection receiving its calls
// (NVTX_INJECTION64_PATH): the orders a real run only produces under rare races (a hot-path
// free reported after its block was handed out again, a context destroyed under the cache).
#include <catch2/catch.hpp>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "allocator/events.h"
#include "fake_nvtx.h"
#include "shim/sanitizer_nvtx.h"

using cudalloc::AllocatorEvent;
using cudalloc::DevicePtr;
using cudalloc::EventKind;

namespace {

constexpr DevicePtr kHeap = 0x700000000000;
constexpr std::size_t kHeapSize = 2 << 20;

cudalloc::AllocatorObserver& observer() {
  cudalloc::shim::start_nvtx_registration();
  return *cudalloc::shim::nvtx_observer();
}

void send(EventKind kind, DevicePtr ptr, std::size_t bytes) {
  AllocatorEvent e{};
  e.kind = kind;
  e.ptr = ptr;
  e.requested = bytes;
  e.rounded = bytes;
  observer().on_event(e);
}

struct Tool {
  fake_nvtx_region_fn region;
  fake_nvtx_stats_fn stats;
  fake_nvtx_first_error_fn first_error;
};

const Tool& tool() {
  static Tool t = [] {
    const char* path = std::getenv("NVTX_INJECTION64_PATH");
    REQUIRE(path != nullptr);
    void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h != nullptr);
    return Tool{reinterpret_cast<fake_nvtx_region_fn>(dlsym(h, "fake_nvtx_region")),
                reinterpret_cast<fake_nvtx_stats_fn>(dlsym(h, "fake_nvtx_stats")),
                reinterpret_cast<fake_nvtx_first_error_fn>(dlsym(h, "fake_nvtx_first_error"))};
  }();
  return t;
}

std::size_t region_size(DevicePtr p) {  // 0: none
  std::size_t size = 0, heap_size = 0;
  uintptr_t heap = 0;
  return tool().region(p, &size, &heap, &heap_size) ? size : 0;
}

fake_nvtx_stats_t stats() {
  fake_nvtx_stats_t s{};
  tool().stats(&s);
  return s;
}

void require_no_errors() {
  const fake_nvtx_stats_t s = stats();
  INFO(tool().first_error());
  REQUIRE(s.errors == 0);
}

}  // namespace

TEST_CASE("nvtx observer: orders the allocator can report") {
  send(EventKind::kSegmentAlloc, kHeap, kHeapSize);
  REQUIRE(stats().heaps_live == 1);
  const DevicePtr x = kHeap + 4096;

  // A block handed out again before its free was reported: registered with the new size,
  // the late free does not unregister it, the real one does.
  send(EventKind::kAlloc, x, 4096);
  send(EventKind::kAlloc, x, 3000);
  CHECK(region_size(x) == 3000);
  send(EventKind::kFree, x, 4096);
  CHECK(region_size(x) == 3000);
  send(EventKind::kFree, x, 3000);
  CHECK(region_size(x) == 0);
  require_no_errors();

  // The freed block coalesced into a larger one that starts before it, before its free was
  // reported: the stale region goes, and its late free changes nothing.
  send(EventKind::kAlloc, x, 4096);
  const DevicePtr y = x - 512;
  send(EventKind::kAlloc, y, 8192);
  CHECK(region_size(x) == 0);
  CHECK(region_size(y) == 8192);
  send(EventKind::kFree, x, 4096);
  CHECK(region_size(y) == 8192);
  send(EventKind::kFree, y, 8192);
  CHECK(region_size(y) == 0);
  // ... or one that starts at a later address inside it.
  send(EventKind::kAlloc, x, 4096);
  send(EventKind::kAlloc, x + 512, 100);
  CHECK(region_size(x) == 0);
  CHECK(region_size(x + 512) == 100);
  send(EventKind::kAlloc, x, 256);  // the stale entry's address handed out again
  CHECK(region_size(x) == 256);
  send(EventKind::kFree, x, 4096);  // the late free
  CHECK(region_size(x) == 256);
  send(EventKind::kFree, x, 256);
  send(EventKind::kFree, x + 512, 100);
  CHECK(region_size(x) == 0);
  CHECK(region_size(x + 512) == 0);
  CHECK(stats().regions_live == 0);
  require_no_errors();

  // A block outside every registered segment is left alone.
  send(EventKind::kAlloc, kHeap + kHeapSize + 4096, 512);
  CHECK(region_size(kHeap + kHeapSize + 4096) == 0);
  send(EventKind::kFree, kHeap + kHeapSize + 4096, 512);

  // The segment goes back with a live block (a context reset): heap and region go, the
  // block's later free is ignored.
  send(EventKind::kAlloc, x, 1000);
  send(EventKind::kSegmentFree, kHeap, kHeapSize);
  CHECK(stats().heaps_live == 0);
  CHECK(stats().regions_live == 0);
  send(EventKind::kFree, x, 1000);
  require_no_errors();

  // A context destroyed under the cache reports nothing: a new segment over the old range
  // replaces the stale heap.
  send(EventKind::kSegmentAlloc, kHeap, kHeapSize);
  send(EventKind::kAlloc, x, 1000);
  send(EventKind::kSegmentAlloc, kHeap + (1 << 20), kHeapSize);
  CHECK(stats().heaps_live == 1);
  CHECK(region_size(x) == 0);
  send(EventKind::kAlloc, kHeap + (1 << 20), 64);
  CHECK(region_size(kHeap + (1 << 20)) == 64);
  send(EventKind::kFree, x, 1000);  // the old block's free
  CHECK(region_size(kHeap + (1 << 20)) == 64);
  require_no_errors();

  const fake_nvtx_stats_t s = stats();
  CHECK(s.domains_cudalloc == 1);
  CHECK(s.mem_inits == 1);
}
