// Faults on the simulated backend: fences that never complete (a hung device), device calls
// failing at a chosen call. The allocator must fall back to new memory, answer out-of-memory
// properly when there is none, never hang, and keep serving once the fault clears.
#include <catch2/catch.hpp>

#include <chrono>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"

using namespace cudalloc;

namespace {
constexpr StreamHandle kA = 0x100, kB = 0x200;

std::int64_t reserved(const DeviceAllocator& a) { return a.stats().reserved_bytes[kStatAll].current; }
std::int64_t allocated(const DeviceAllocator& a) { return a.stats().allocated_bytes[kStatAll].current; }
}  // namespace

TEST_CASE("fences that never complete: new memory, then out-of-memory, never a hang", "[stall]") {
  for (bool expandable : {false, true}) {
    for (bool thread_cache : {false, true}) {
      INFO("expandable " << expandable << " thread_cache " << thread_cache);
      SimBackend sim(SimOptions{.total_memory = 256 * kMiB, .host_memory = false});
      AllocatorOptions o;
      o.expandable_segments = expandable;
      o.thread_cache = thread_cache;
      DeviceAllocator alloc(sim, o);
      sim.set_fences_stall(true);
      const auto start = std::chrono::steady_clock::now();
      // Work queued on A; blocks freed in A's order are not reusable on B until it runs.
      std::vector<DevicePtr> live;
      for (int i = 0; i < 8; ++i) {
        DevicePtr p = 0;
        REQUIRE(alloc.allocate(8 * kMiB, kA, &p) == Status::kOk);
        live.push_back(p);
      }
      sim.enqueue(kA);
      for (DevicePtr p : live) REQUIRE(alloc.free(p, FreeOrder::kStream, kA) == Status::kOk);
      live.clear();
      // B cannot reuse A's pending blocks: it gets new memory while there is some...
      std::size_t got = 0;
      Status st = Status::kOk;
      while (st == Status::kOk && got < 64) {
        DevicePtr p = 0;
        st = alloc.allocate(8 * kMiB, kB, &p);
        if (st == Status::kOk) {
          live.push_back(p);
          ++got;
        }
      }
      // ...and, with the device full, the ladder waits on the fences (wait() runs the stream)
      // or answers out-of-memory: either way it returns.
      CHECK((st == Status::kOk || st == Status::kOutOfMemory));
      CHECK(static_cast<std::size_t>(reserved(alloc)) <= 256 * kMiB);
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
      for (DevicePtr p : live) REQUIRE(alloc.free(p, FreeOrder::kCompleted) == Status::kOk);
      sim.set_fences_stall(false);
      sim.run_all();
      alloc.release_cached();
      CHECK(reserved(alloc) == 0);
      CHECK(sim.used_bytes() == 0);
      // Serving resumes.
      DevicePtr p = 0;
      REQUIRE(alloc.allocate(100 * kMiB, kB, &p) == Status::kOk);
      REQUIRE(alloc.free(p, FreeOrder::kDevice) == Status::kOk);
    }
  }
}

TEST_CASE("a cudaFree'd block behind a stalled device fence is never reused early", "[stall]") {
  SimBackend sim(SimOptions{.total_memory = 64 * kMiB, .host_memory = false});
  DeviceAllocator alloc(sim, AllocatorOptions{});
  sim.set_fences_stall(true);
  DevicePtr p = 0;
  REQUIRE(alloc.allocate(1 * kMiB, kNoStream, &p) == Status::kOk);
  sim.enqueue(kA);  // work that may use p
  REQUIRE(alloc.free(p, FreeOrder::kDevice) == Status::kOk);
  std::vector<DevicePtr> got;
  for (int i = 0; i < 8; ++i) {
    DevicePtr q = 0;
    REQUIRE(alloc.allocate(1 * kMiB, kNoStream, &q) == Status::kOk);
    CHECK(q != p);  // the fence has not completed
    got.push_back(q);
  }
  CHECK(sim.queued(kA) == 1);
  for (DevicePtr q : got) REQUIRE(alloc.free(q, FreeOrder::kCompleted) == Status::kOk);
  sim.set_fences_stall(false);
  sim.run_all();
  alloc.release_cached();
  CHECK(sim.used_bytes() == 0);
}

TEST_CASE("device calls failing at a chosen call: out-of-memory or retried, nothing leaked", "[fail]") {
  for (SimOp op : {SimOp::kAllocate, SimOp::kReserve, SimOp::kMap}) {
    for (std::size_t after : {0u, 1u, 2u, 5u}) {
      INFO("op " << static_cast<int>(op) << " after " << after);
      SimBackend sim(SimOptions{.total_memory = 512 * kMiB, .host_memory = false});
      AllocatorOptions o;
      o.expandable_segments = op != SimOp::kAllocate;
      DeviceAllocator alloc(sim, o);
      sim.fail_after(op, after);
      std::vector<DevicePtr> live;
      std::int64_t failures = 0;
      for (int i = 0; i < 12; ++i) {
        DevicePtr p = 0;
        const Status st = alloc.allocate((3 + i) * kMiB + 123, i % 2 ? kA : kB, &p);
        if (st == Status::kOk) {
          live.push_back(p);
        } else {
          ++failures;
          CHECK(p == 0);
          CHECK((st == Status::kOutOfMemory || st == Status::kBackendError));
        }
        CHECK(reserved(alloc) == static_cast<std::int64_t>(sim.used_bytes()));
      }
      CHECK(failures <= 1);  // one-shot
      for (DevicePtr p : live) REQUIRE(alloc.free(p, FreeOrder::kDevice) == Status::kOk);
      CHECK(allocated(alloc) == 0);
      alloc.release_cached();
      CHECK(sim.used_bytes() == 0);
    }
  }
}

TEST_CASE("unmap failing during a release keeps the chunk mapped and accounted; a later release returns it",
          "[fail]") {
  SimBackend sim(SimOptions{.total_memory = 512 * kMiB, .host_memory = false});
  AllocatorOptions o;
  o.expandable_segments = true;
  DeviceAllocator alloc(sim, o);
  DevicePtr p = 0;
  REQUIRE(alloc.allocate(100 * kMiB, kA, &p) == Status::kOk);
  REQUIRE(alloc.free(p, FreeOrder::kStream, kA) == Status::kOk);
  sim.fail_after(SimOp::kUnmap, 1);
  alloc.release_cached();
  CHECK(reserved(alloc) == static_cast<std::int64_t>(sim.used_bytes()));
  alloc.release_cached();
  CHECK(sim.used_bytes() == 0);
  CHECK(reserved(alloc) == 0);
}
