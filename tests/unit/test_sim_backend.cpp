#include <catch2/catch.hpp>

#include <cstring>

#include "allocator/sim_backend.h"

using namespace cudalloc;

TEST_CASE("segments are aligned like the driver's and count against capacity") {
  SimBackend sim({.total_memory = 8 * kMiB});
  DevicePtr small = 0, large = 0, none = 0;
  REQUIRE(sim.allocate_segment(4096, &small) == Status::kOk);
  REQUIRE(sim.allocate_segment(4 * kMiB, &large) == Status::kOk);
  CHECK(small % 512 == 0);
  CHECK(large % (2 * kMiB) == 0);
  CHECK(sim.used_bytes() == 4096 + 4 * kMiB);
  CHECK(sim.allocate_segment(4 * kMiB, &none) == Status::kOutOfMemory);
  CHECK(none == 0);
  std::memset(reinterpret_cast<void*>(large), 1, 4 * kMiB);  // really backed
  CHECK(sim.is_accessible(large + 100, 100));
  CHECK(sim.free_segment(large, 4 * kMiB) == Status::kOk);
  CHECK_FALSE(sim.is_accessible(large + 100, 100));
  CHECK(sim.free_segment(large, 4 * kMiB) == Status::kInvalidValue);
  CHECK(sim.segment_calls() == 2);
  CHECK(sim.free_calls() == 1);
}

TEST_CASE("stream work runs only when the device is let to catch up, in order") {
  SimBackend sim;
  std::vector<int> order;
  sim.enqueue(5, [&] { order.push_back(1); });
  sim.enqueue(5, [&] { order.push_back(2); });
  sim.enqueue(6, [&] { order.push_back(3); });
  CHECK(order.empty());
  auto fence = sim.record_fence(5);
  auto device = sim.record_device_fence();
  CHECK_FALSE(fence->done());
  CHECK(sim.run(5, 1) == 1);
  CHECK(order == std::vector<int>{1});
  CHECK(fence->wait());
  CHECK(fence->done());
  CHECK(order == std::vector<int>{1, 2});
  CHECK_FALSE(device->done());
  sim.run_all();
  CHECK(device->done());
  CHECK(order == std::vector<int>{1, 2, 3});
}

TEST_CASE("stalled fences never complete on their own") {
  SimBackend sim;
  auto f = sim.record_fence(0);
  CHECK(f->done());
  sim.set_fences_stall(true);
  CHECK_FALSE(f->done());
  sim.set_fences_stall(false);
  CHECK(f->done());
}

TEST_CASE("virtual memory: reserve, map on granularity, unmap exactly, with faults") {
  SimBackend sim({.total_memory = 16 * kMiB, .vm_granularity = 2 * kMiB});
  DevicePtr va = 0;
  REQUIRE(sim.reserve_address(64 * kMiB, &va) == Status::kOk);
  CHECK(va % (2 * kMiB) == 0);
  CHECK(sim.reserve_address(3 * kMiB, &va) == Status::kInvalidValue);  // not a multiple
  REQUIRE(sim.reserve_address(64 * kMiB, &va) == Status::kOk);
  CHECK(sim.map(va + kMiB, 2 * kMiB) == Status::kInvalidValue);        // unaligned
  REQUIRE(sim.map(va, 4 * kMiB) == Status::kOk);
  CHECK(sim.map(va + 2 * kMiB, 2 * kMiB) == Status::kInvalidValue);    // overlaps
  REQUIRE(sim.map(va + 4 * kMiB, 2 * kMiB) == Status::kOk);
  std::memset(reinterpret_cast<void*>(va), 7, 6 * kMiB);
  CHECK(sim.used_bytes() == 6 * kMiB);
  CHECK(sim.unmap(va, 2 * kMiB) == Status::kInvalidValue);  // splits a mapping
  CHECK(sim.free_address(va, 64 * kMiB) == Status::kInvalidValue);  // still mapped
  sim.fail_after(SimOp::kMap, 0);
  CHECK(sim.map(va + 6 * kMiB, 2 * kMiB) == Status::kOutOfMemory);
  CHECK(sim.map(va + 6 * kMiB, 12 * kMiB) == Status::kOutOfMemory);  // past capacity
  REQUIRE(sim.unmap(va, 6 * kMiB) == Status::kOk);
  CHECK(sim.used_bytes() == 0);
  CHECK_FALSE(sim.is_accessible(va, 1));
  CHECK(sim.free_address(va, 64 * kMiB) == Status::kOk);
}
