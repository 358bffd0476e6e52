// A device allocator on a simulated device, for the unit tests of the allocator core.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"

namespace cudalloc::testing {

struct Fixture {
  explicit Fixture(AllocatorOptions o = {}, SimOptions so = {}) : options(o), sim(so), alloc(sim, options) {}
  AllocatorOptions options;
  SimBackend sim;
  DeviceAllocator alloc;

  DevicePtr get(std::size_t bytes, StreamHandle stream = kNoStream) {
    DevicePtr p = 0;
    REQUIRE(alloc.allocate(bytes, stream, &p) == Status::kOk);
    REQUIRE(p != 0);
    return p;
  }
  std::int64_t stat(const char* key) { return alloc.stats().to_map().at(key); }

  // get() for the threads a test starts. Catch2 v2's assertions are not thread-safe (TSan
  // reports them), so such a thread only counts a failed request here, and the test's own
  // thread checks failed_gets == 0 once the thread is joined.
  DevicePtr get_in_thread(std::size_t bytes, StreamHandle stream = kNoStream) {
    DevicePtr p = 0;
    if (alloc.allocate(bytes, stream, &p) != Status::kOk || p == 0) ++failed_gets;
    return p;
  }
  std::atomic<int> failed_gets{0};
};

}  // namespace cudalloc::testing
