#include <catch2/catch.hpp>

#include <vector>

#include "allocator/sim_backend.h"
#include "allocator/stream_fence.h"

using namespace cudalloc;

namespace {
Block block(std::size_t size) {
  Block b;
  b.size = size;
  b.state = BlockState::kPending;
  return b;
}
}  // namespace

TEST_CASE("a block waiting on several fences is ready after the last one") {
  SimBackend sim({.host_memory = false});
  FenceQueue q;
  Block b = block(4096);
  sim.enqueue(1);
  sim.enqueue(2);
  q.add(sim.record_fence(1), &b);
  q.add(sim.record_fence(2), &b);
  CHECK(q.pending_bytes() == 4096);
  CHECK(q.pending_blocks() == 1);
  std::vector<Block*> ready;
  auto on_ready = [&](Block* r) { ready.push_back(r); };
  CHECK(q.collect(on_ready) == 0);
  sim.run(1);
  CHECK(q.collect(on_ready) == 0);
  CHECK(b.pending_fences == 1);
  sim.run(2);
  CHECK(q.collect(on_ready) == 1);
  CHECK(ready == std::vector<Block*>{&b});
  CHECK(q.pending_bytes() == 0);
}

TEST_CASE("an epoch gathers device-ordered frees under one fence, recorded when closed") {
  SimBackend sim({.host_memory = false});
  FenceQueue q;
  Block a = block(512), b = block(1024);
  q.defer_to_epoch(&a);
  q.defer_to_epoch(&b);
  CHECK(q.epoch_open());
  CHECK(q.epoch_bytes() == 1536);
  CHECK(sim.device_fences() == 0);
  sim.enqueue(7);
  q.close_epoch(sim);
  CHECK_FALSE(q.epoch_open());
  CHECK(sim.device_fences() == 1);
  sim.enqueue(8);  // queued after the fence: not waited for
  std::size_t n = 0;
  auto count = [&](Block*) { ++n; };
  q.collect(count);
  CHECK(n == 0);
  sim.run(7);
  q.collect(count);
  CHECK(n == 2);
  CHECK(sim.queued(8) == 1);
}

TEST_CASE("wait_all lets the device catch up; a fence that cannot wait stays queued") {
  SimBackend sim({.host_memory = false});
  FenceQueue q;
  Block a = block(512);
  sim.enqueue(3);
  q.add(sim.record_fence(3), &a);
  Block b = block(512);
  q.defer_to_epoch(&b);
  std::size_t n = 0;
  CHECK(q.wait_all(sim, [&](Block*) { ++n; }) == 2);
  CHECK(n == 2);
  CHECK(sim.queued(3) == 0);

  struct Stuck final : Fence {
    bool done() override { return false; }
    bool wait() override { return false; }
  };
  Block c = block(512);
  q.add(std::make_unique<Stuck>(), &c);
  CHECK(q.wait_all(sim, [&](Block*) { ++n; }) == 0);
  CHECK(q.pending_blocks() == 1);
  q.clear();
  CHECK(q.pending_blocks() == 0);
  CHECK(q.pending_bytes() == 0);
}
