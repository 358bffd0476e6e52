// A thread's cache of free blocks (allocator/thread_cache.h), through the device allocator on a
// simulated device: which blocks its bins hand out without the device lock, and what they hold.
#include <vector>

#include "allocator/thread_cache.h"
#include "tests/unit/sim_fixture.h"

using namespace cudalloc;
using cudalloc::testing::Fixture;

namespace {

constexpr StreamHandle kStreamA = 0x10;

Status release(Fixture& f, DevicePtr p) { return f.alloc.free(p, FreeOrder::kStream, kStreamA, true); }

}  // namespace

TEST_CASE("a cached block serves a smaller request of nearby size without the device lock") {
  Fixture f;
  const DevicePtr a = f.get(64 * 1024, kStreamA);
  REQUIRE(release(f, a) == Status::kOk);
  const auto locked = f.stat("num_locked_allocs");
  CHECK(f.get(60 * 1024, kStreamA) == a);
  CHECK(f.stat("num_locked_allocs") == locked);
  // The program holds the whole block; it asked for less.
  CHECK(f.stat("allocated_bytes.all.current") == 64 * 1024);
  CHECK(f.stat("requested_bytes.all.current") == 60 * 1024);
}

TEST_CASE("a request takes a cached block of its exact size before a larger one of its class") {
  Fixture f;
  // 96 KiB and 100 KiB share a class; the larger one is the newest in the bin.
  const DevicePtr exact = f.get(96 * 1024, kStreamA);
  const DevicePtr larger = f.get(100 * 1024, kStreamA);
  REQUIRE(release(f, exact) == Status::kOk);
  REQUIRE(release(f, larger) == Status::kOk);
  CHECK(f.get(96 * 1024, kStreamA) == exact);
  CHECK(f.get(96 * 1024, kStreamA) == larger);  // then the larger one, within the slack
}

TEST_CASE("a cached block more than half again the request's size is left for its own size") {
  Fixture f;
  const DevicePtr big = f.get(256 * 1024, kStreamA);
  REQUIRE(release(f, big) == Status::kOk);
  const auto locked = f.stat("num_locked_allocs");
  const DevicePtr small = f.get(128 * 1024, kStreamA);
  CHECK(small != big);
  CHECK(f.stat("num_locked_allocs") == locked + 1);
  CHECK(f.get(256 * 1024, kStreamA) == big);
}

TEST_CASE("a large split block freed in stream order reaches the pool at the next locked allocation") {
  Fixture f;
  // Two blocks split from one 20 MiB segment: the bins park neither (only whole segments).
  const DevicePtr a = f.get(3 * kMiB, kStreamA);
  const DevicePtr b = f.get(3 * kMiB, kStreamA);
  const auto segments = f.stat("num_device_alloc");
  const auto locked_frees = f.stat("num_locked_frees");
  REQUIRE(release(f, a) == Status::kOk);
  CHECK(f.stat("num_locked_frees") == locked_frees);  // it waits in the thread's spill
  CHECK(f.stat("allocated_bytes.all.current") == static_cast<std::int64_t>(3 * kMiB));
  // The next large allocation takes the lock, returns the spill first, and its best fit finds it.
  CHECK(f.get(3 * kMiB, kStreamA) == a);
  CHECK(f.stat("num_device_alloc") == segments);
  REQUIRE(release(f, b) == Status::kOk);
}

TEST_CASE("a thread's bins hold at most kSmallBytes of small blocks") {
  Fixture f;
  // Sizes from 512 KiB to 1 MiB, spread over eight classes so that no bin fills up: three times
  // kSmallBytes in all, which only the byte bound keeps out of the bins.
  std::vector<DevicePtr> blocks;
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0, total = 0; total < 3 * ThreadCache::kSmallBytes; ++i) {
    sizes.push_back(kSmallSize / 2 + (i % 64) * 8 * 1024);
    total += sizes.back();
  }
  for (std::size_t size : sizes) blocks.push_back(f.get(size, kStreamA));
  for (DevicePtr p : blocks) REQUIRE(release(f, p) == Status::kOk);
  CHECK(f.stat("thread_cache_bytes.max_thread") <=
        static_cast<std::int64_t>(ThreadCache::kSmallBytes + ThreadCache::kSpillBytes));
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  // Every size is served again, from the bins, the spill or the pools; a block from the bins
  // may be larger than asked, within the slack (half the request for small ones).
  std::vector<DevicePtr> again;
  std::int64_t asked = 0;
  for (std::size_t size : sizes) {
    again.push_back(f.get(size, kStreamA));
    asked += static_cast<std::int64_t>(size);
  }
  CHECK(f.stat("requested_bytes.all.current") == asked);
  CHECK(f.stat("allocated_bytes.all.current") <= asked + asked / 2);
  for (DevicePtr p : again) REQUIRE(release(f, p) == Status::kOk);
}

TEST_CASE("a request near a block in the thread's spill takes it without the device lock") {
  Fixture f;
  const DevicePtr a = f.get(3 * kMiB, kStreamA);
  const DevicePtr b = f.get(3 * kMiB, kStreamA);
  REQUIRE(release(f, a) == Status::kOk);  // split from a segment: spilled, not parked
  const auto locked = f.stat("num_locked_allocs");
  CHECK(f.get(3 * kMiB - 256 * 1024, kStreamA) == a);
  CHECK(f.stat("num_locked_allocs") == locked);
  // A spilled block more than the slack past the request waits for the pools: the request takes
  // the device lock, which returns the spill before the pools' best fit.
  REQUIRE(release(f, b) == Status::kOk);
  (void)f.get(3 * kMiB / 2, kStreamA);
  CHECK(f.stat("num_locked_allocs") == locked + 1);
}

TEST_CASE("a thread's bins hold four streams' blocks at once; a fifth stream's wait in its spill") {
  Fixture f;
  constexpr StreamHandle kStreams[] = {0x10, 0x20, 0x30, 0x40, 0x50};
  std::vector<DevicePtr> blocks;
  for (StreamHandle s : kStreams) blocks.push_back(f.get(4096, s));
  const auto locked_allocs = f.stat("num_locked_allocs");
  const auto locked_frees = f.stat("num_locked_frees");
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    REQUIRE(f.alloc.free(blocks[i], FreeOrder::kStream, kStreams[i], true) == Status::kOk);
  }
  CHECK(f.stat("num_locked_frees") == locked_frees);
  // Each comes back to its own stream without the device lock: four from the bins, the fifth
  // from the spill.
  for (std::size_t i = blocks.size(); i-- > 0;) CHECK(f.get(4096, kStreams[i]) == blocks[i]);
  CHECK(f.stat("num_locked_allocs") == locked_allocs);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    REQUIRE(f.alloc.free(blocks[i], FreeOrder::kStream, kStreams[i], true) == Status::kOk);
  }
}
