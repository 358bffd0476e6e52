#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"
#include "allocator/submission_watch.h"
#include "allocator/thread_cache.h"
#include "sim_fixture.h"

using namespace cudalloc;

namespace {

constexpr StreamHandle kStreamA = 0x10;

SimOptions watched() {
  SimOptions so;
  so.watch_submissions = true;
  return so;
}

// The core's fixture with pairs of the test's own.
struct Fixture : testing::Fixture {
  explicit Fixture(SimOptions so = watched()) : testing::Fixture({}, so) {}
  void put(DevicePtr p) { REQUIRE(alloc.free(p, FreeOrder::kDevice) == Status::kOk); }
  // cudaMalloc+cudaFree pairs of `bytes` with no work queued: the pointers handed out.
  std::set<DevicePtr> pairs(std::size_t bytes, int n) {
    std::set<DevicePtr> seen;
    for (int i = 0; i < n; ++i) {
      const DevicePtr p = get(bytes);
      seen.insert(p);
      put(p);
    }
    return seen;
  }
};

}  // namespace

TEST_CASE("a watch slot is dirty until cleared, and dirty again at the next note") {
  SubmissionWatch w;
  const int a = w.open_slot();
  const int b = w.open_slot();
  REQUIRE(a != b);
  CHECK(w.quiet_since(a) == 0);
  w.clear(a, 7);
  CHECK(w.quiet_since(a) == 7);
  CHECK(w.quiet_since(b) == 0);
  w.clear(b, 9);
  w.note();
  CHECK(w.quiet_since(a) == 0);
  CHECK(w.quiet_since(b) == 0);
  w.clear(a, 8);
  CHECK(w.quiet_since(a) == 8);
  w.mark_dirty(a);
  CHECK(w.quiet_since(a) == 0);
}

TEST_CASE("a blind watch is never clean again, and slots run out into kNoSlot") {
  SubmissionWatch w;
  const int a = w.open_slot();
  w.clear(a, 3);
  w.go_blind();
  CHECK(w.blind());
  CHECK(w.quiet_since(a) == 0);
  w.clear(a, 4);
  CHECK(w.quiet_since(a) == 0);
  for (int i = 1; i < SubmissionWatch::kSlots; ++i) CHECK(w.open_slot() != SubmissionWatch::kNoSlot);
  CHECK(w.open_slot() == SubmissionWatch::kNoSlot);
  CHECK(w.quiet_since(SubmissionWatch::kNoSlot) == 0);
  w.clear(SubmissionWatch::kNoSlot, 5);  // harmless
}

TEST_CASE("cudaFree'd pairs with no work queued reuse one block and record no more fences") {
  for (const std::size_t bytes : {std::size_t{512}, std::size_t{64} * kKiB, std::size_t{1} * kMiB,
                                  std::size_t{4} * kMiB, std::size_t{256} * kMiB}) {
    INFO("bytes " << bytes);
    Fixture f;
    f.pairs(bytes, 200);  // the first batches close, a fence covers them and passes
    const std::size_t fences = f.sim.device_fences();
    const std::size_t segments = f.sim.segment_calls();
    const std::set<DevicePtr> seen = f.pairs(bytes, 2000);
    CHECK(seen.size() == 1);
    CHECK(f.sim.device_fences() == fences);
    CHECK(f.sim.segment_calls() == segments);
  }
}

TEST_CASE("without the watch, the same pairs fence their batches") {
  Fixture f(SimOptions{});
  f.pairs(64 * kKiB, 200);
  const std::size_t fences = f.sim.device_fences();
  f.pairs(64 * kKiB, 2000);
  CHECK(f.sim.device_fences() > fences);
}

TEST_CASE("work queued after the last fence keeps a cudaFree'd block until a fence after it passed") {
  for (const std::size_t bytes : {std::size_t{64} * kKiB, std::size_t{256} * kMiB}) {
    INFO("bytes " << bytes);
    Fixture f;
    f.pairs(bytes, 200);
    const DevicePtr a = f.get(bytes);
    f.sim.enqueue_access(kStreamA, a, bytes);  // a kernel that uses the block, not yet run
    f.put(a);
    // However many pairs follow, `a` comes back only once the kernel ran (a thread at its bound
    // of large blocks waits for the device, which runs it).
    int early = 0;
    int reused = 0;
    for (int i = 0; i < 300; ++i) {
      const DevicePtr p = f.get(bytes);
      if (p == a) {
        ++reused;
        if (f.sim.queued(kStreamA) != 0) ++early;
      }
      f.put(p);
    }
    CHECK(early == 0);
    if (bytes <= kSmallSize) CHECK(reused == 0);  // small: nothing waits for the device
    // Once the kernel ran and a fence after it passed, `a` serves again (the thread cycles on
    // one block until its bins run dry: then it takes its batches back).
    f.sim.run_all();
    f.pairs(bytes, 10);
    std::vector<DevicePtr> live;
    bool again = false;
    for (int i = 0; i < 600 && !again; ++i) {
      live.push_back(f.get(bytes));
      again = live.back() == a;
    }
    CHECK(again);
    for (DevicePtr p : live) f.put(p);
    CHECK(f.sim.bad_accesses() == 0);
  }
}

TEST_CASE("work queued on another thread between a fence and a free keeps the block") {
  Fixture f;
  f.pairs(64 * kKiB, 200);
  const DevicePtr a = f.get(64 * kKiB);
  std::thread other([&] { f.sim.enqueue_access(kStreamA, a, 64 * kKiB); });
  other.join();  // the program's own ordering: the launch happens before the free
  f.put(a);
  std::set<DevicePtr> seen = f.pairs(64 * kKiB, 100);
  CHECK(seen.count(a) == 0);
}

TEST_CASE("a device reset forgets the fences, and the watch with them") {
  Fixture f;
  f.pairs(512, 200);
  const std::size_t fences = f.sim.device_fences();
  f.alloc.forget_all();
  // The first pairs after the reset fence again before they reuse.
  f.pairs(512, 200);
  CHECK(f.sim.device_fences() > fences);
}

TEST_CASE("a watched allocator's first small cudaFree is fenced at once, and the next pair reuses its block") {
  for (const std::size_t bytes : {std::size_t{512}, std::size_t{64} * kKiB}) {
    INFO("bytes " << bytes);
    Fixture f;
    const DevicePtr a = f.get(bytes);
    f.put(a);
    CHECK(f.sim.device_fences() == 1);
    CHECK(f.get(bytes) == a);
    f.put(a);
    CHECK(f.pairs(bytes, 100) == std::set<DevicePtr>{a});
    CHECK(f.sim.device_fences() == 1);
    CHECK(f.sim.segment_calls() == 1);
  }
}
