#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"

using namespace cudalloc;

namespace {

constexpr StreamHandle kStreamA = 0x10;

struct Fixture {
  explicit Fixture(std::size_t limit = 0, std::size_t total = 1 * kGiB, bool blocking_streams = false,
                   bool virtual_memory = true)
      : sim(make_sim(total, blocking_streams, virtual_memory)) {
    options.expandable_segments = true;
    options.memory_limit_bytes = limit;
    alloc = std::make_unique<DeviceAllocator>(sim, options);
  }
  static SimOptions make_sim(std::size_t total, bool blocking_streams, bool virtual_memory) {
    SimOptions so;
    so.total_memory = total;
    so.blocking_streams = blocking_streams;
    so.virtual_memory = virtual_memory;
    return so;
  }
  DevicePtr get(std::size_t bytes, StreamHandle stream = kNoStream) {
    DevicePtr p = 0;
    REQUIRE(alloc->allocate(bytes, stream, &p) == Status::kOk);
    return p;
  }
  std::int64_t stat(const char* key) { return alloc->stats().to_map().at(key); }

  AllocatorOptions options;
  SimBackend sim;
  std::unique_ptr<DeviceAllocator> alloc;
};

}  // namespace

TEST_CASE("an expandable segment grows in place, page by page") {
  Fixture f;
  DevicePtr a = f.get(6 * kMiB);
  DevicePtr b = f.get(8 * kMiB);
  DevicePtr c = f.get(20 * kMiB);
  CHECK(b == a + 6 * kMiB);
  CHECK(c == b + 8 * kMiB);
  CHECK(f.sim.map_calls() == 3);
  CHECK(f.sim.segment_calls() == 0);  // no plain segment was cut
  CHECK(f.stat("segment.all.current") == 1);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(34 * kMiB));
  std::memset(reinterpret_cast<void*>(a), 1, 34 * kMiB);  // all of it is really mapped
}

TEST_CASE("growth joins the free block at the end instead of mapping a whole request") {
  Fixture f;
  DevicePtr a = f.get(10 * kMiB);
  DevicePtr b = f.get(4 * kMiB);
  f.alloc->free(b, FreeOrder::kCompleted);
  // 4 MiB are free at the growth point: a 10 MiB request maps only 6 more.
  DevicePtr c = f.get(10 * kMiB);
  CHECK(c == b);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(20 * kMiB));
  CHECK(f.sim.map_calls() == 3);
  (void)a;
}

TEST_CASE("release gives back free chunks and keeps live blocks mapped") {
  Fixture f;
  DevicePtr a = f.get(12 * kMiB);
  DevicePtr b = f.get(12 * kMiB);
  DevicePtr c = f.get(12 * kMiB);
  std::memset(reinterpret_cast<void*>(a), 0x11, 12 * kMiB);
  std::memset(reinterpret_cast<void*>(c), 0x33, 12 * kMiB);
  f.alloc->free(b, FreeOrder::kCompleted);
  CHECK(f.alloc->release_cached() == 12 * kMiB);
  CHECK(f.sim.used_bytes() == 24 * kMiB);
  CHECK_FALSE(f.sim.is_accessible(b, 1));
  CHECK(f.sim.is_accessible(a, 12 * kMiB));
  CHECK(reinterpret_cast<unsigned char*>(c)[12 * kMiB - 1] == 0x33);
  // The hole is mapped again when needed.
  DevicePtr d = f.get(12 * kMiB);
  CHECK(d == b);
  CHECK(f.sim.is_accessible(d, 12 * kMiB));
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(36 * kMiB));
}

TEST_CASE("chunks are unmapped only after the segment's stream has passed the free") {
  Fixture f;
  DevicePtr a = f.get(12 * kMiB, kStreamA);
  bool ran = false;
  f.sim.enqueue(kStreamA, [&] { ran = true; });
  f.alloc->free(a, FreeOrder::kStream, kStreamA);
  f.alloc->release_cached();
  CHECK(ran);  // the queued work ran before the memory went away
  CHECK(f.sim.used_bytes() == 0);
}

TEST_CASE("a cudaFree'd block reused under an ordering fence is unmapped only after its work ran") {
  Fixture f(0, 1 * kGiB, /*blocking_streams=*/true);
  DevicePtr a = f.get(64 * kMiB);
  bool ran = false;
  f.sim.enqueue(0, [&] { ran = true; });  // its last owner's work, still queued
  f.alloc->free(a, FreeOrder::kDevice);
  // The epoch (64 MiB) is fenced by this miss, and the fence orders reuse: `a` serves at once.
  CHECK(f.get(64 * kMiB) == a);
  CHECK_FALSE(ran);
  f.alloc->free(a, FreeOrder::kCompleted);
  f.alloc->release_cached();
  CHECK(ran);  // the device caught up before the chunk was unmapped
  CHECK(f.sim.used_bytes() == 0);
}

TEST_CASE("garbage collection does not wait for the device when no chunk could be given back") {
  Fixture f(0, 1 * kGiB);
  f.options.garbage_collection_threshold = 0.05;  // 51 MiB of the 1 GiB device
  f.alloc = std::make_unique<DeviceAllocator>(f.sim, f.options);
  std::vector<DevicePtr> live;
  for (int i = 0; i < 4; ++i) live.push_back(f.get(16 * kMiB));  // all live, all mapped
  bool ran = false;
  f.sim.enqueue(0, [&] { ran = true; });
  const std::size_t fences = f.sim.device_fences();
  live.push_back(f.get(16 * kMiB));  // above the threshold: collection runs, finds nothing
  CHECK_FALSE(ran);
  CHECK(f.sim.device_fences() == fences);
  // Once a chunk is free it is given back, after the device caught up (a request it cannot
  // serve misses and collects).
  f.alloc->free(live[1], FreeOrder::kCompleted);
  live.push_back(f.get(32 * kMiB));
  CHECK(ran);
  CHECK(f.sim.unmap_calls() >= 1);
  for (DevicePtr p : live) {
    if (p != live[1]) f.alloc->free(p, FreeOrder::kCompleted);
  }
}

TEST_CASE("the limit caps mapped memory, and a failed map is rolled back and retried") {
  Fixture f(40 * kMiB);
  std::vector<DevicePtr> ptrs;
  DevicePtr p = 0;
  while (f.alloc->allocate(8 * kMiB, kNoStream, &p) == Status::kOk) ptrs.push_back(p);
  CHECK(ptrs.size() == 5);
  CHECK(f.sim.used_bytes() == 40 * kMiB);
  for (DevicePtr q : ptrs) f.alloc->free(q, FreeOrder::kCompleted);
  f.alloc->release_cached();
  CHECK(f.sim.used_bytes() == 0);

  const auto retries = f.stat("num_alloc_retries");  // the OOM above went down the ladder once
  f.sim.fail_after(SimOp::kMap, 0);
  DevicePtr r = f.get(16 * kMiB);  // first map fails; the ladder retries
  CHECK(r != 0);
  CHECK(f.stat("num_alloc_retries") == retries + 1);
  CHECK(f.sim.used_bytes() == 16 * kMiB);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(16 * kMiB));
}

TEST_CASE("expandable segments waste less than plain ones on a shape-varying pattern") {
  // Alternating sizes that plain segments serve with stranded remainders.
  auto run = [](bool expandable) {
    AllocatorOptions o;
    o.expandable_segments = expandable;
    o.thread_cache = false;
    SimBackend sim;
    DeviceAllocator alloc(sim, o);
    std::vector<DevicePtr> live;
    for (int step = 0; step < 20; ++step) {
      for (DevicePtr p : live) alloc.free(p, FreeOrder::kCompleted);
      live.clear();
      const std::size_t unit = (2 + step % 5) * kMiB + 512 * kKiB;
      for (int i = 0; i < 8; ++i) {
        DevicePtr p = 0;
        REQUIRE(alloc.allocate(unit * (1 + i % 3), kNoStream, &p) == Status::kOk);
        live.push_back(p);
      }
    }
    const auto s = alloc.stats();
    return static_cast<double>(s.allocated_bytes[kStatAll].peak) / static_cast<double>(s.reserved_bytes[kStatAll].peak);
  };
  const double plain = run(false);
  const double grown = run(true);
  INFO("plain " << plain << " expandable " << grown);
  CHECK(grown > plain);
  CHECK(grown > 0.9);
}

TEST_CASE("with expandable segments any 512-byte remainder is split off") {
  Fixture f;
  DevicePtr a = f.get(5 * kMiB + 512);  // 6 MiB mapped; the rest stays free
  DevicePtr b = f.get(kMiB + 512);      // the 1 MiB - 512 B remainder is too small: grows behind it
  CHECK(f.alloc->find(a)->size == 5 * kMiB + 512);
  CHECK(b == a + 5 * kMiB + 512);
}

TEST_CASE("max_split_size_mb does not stop an expandable segment from serving requests") {
  // Regression: with max_split_size the merged free range at the growth point counted as an
  // oversize block, no request could use it, and the segment grew until the device was full.
  Fixture f;
  f.options.max_split_size = 64 * kMiB;
  f.alloc = std::make_unique<DeviceAllocator>(f.sim, f.options);
  for (int round = 0; round < 20; ++round) {
    std::vector<DevicePtr> live;
    for (int i = 0; i < 8; ++i) live.push_back(f.get((3 + i) * kMiB));
    for (DevicePtr p : live) f.alloc->free(p, FreeOrder::kCompleted);
  }
  CHECK(f.stat("reserved_bytes.all.peak") <= static_cast<std::int64_t>(64 * kMiB));
}

TEST_CASE("a live block in the middle leaves room for a large request once free chunks go back") {
  // Regression (found on a GPU): with the address range sized to the limit, the space after
  // a live block was too short for a large request even though the limit allowed it.
  Fixture f(64 * kMiB, 1 * kGiB);
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(f.get(8 * kMiB));
  for (int i = 0; i < 8; ++i) {
    if (i != 3) f.alloc->free(blocks[i], FreeOrder::kDevice);
  }
  std::memset(reinterpret_cast<void*>(blocks[3]), 3, 8 * kMiB);
  DevicePtr big = f.get(48 * kMiB);
  std::memset(reinterpret_cast<void*>(big), 4, 48 * kMiB);
  CHECK(reinterpret_cast<unsigned char*>(blocks[3])[8 * kMiB - 1] == 3);
  CHECK(f.sim.used_bytes() <= 64 * kMiB);
  DevicePtr past = 0;
  CHECK(f.alloc->allocate(16 * kMiB, kNoStream, &past) == Status::kOutOfMemory);
  f.alloc->free(big, FreeOrder::kCompleted);
  CHECK(f.get(16 * kMiB) != 0);  // still serving after the OOM
}

TEST_CASE("growth maps where the fewest new bytes complete the request, not at the first hole") {
  // A hole at the start of the segment (its chunk given back) and, after a live block, a free
  // mapped block at the growth point. Another stream's segment holds the rest of the limit:
  // mapping the whole request in the hole passes the limit, growing behind the free block
  // needs only the difference and fits.
  constexpr StreamHandle kOther = 0x20;
  Fixture f(64 * kMiB, 1 * kGiB);
  DevicePtr a = f.get(32 * kMiB);  // chunk [0, 32)
  DevicePtr c = f.get(16 * kMiB);  // chunk [32, 48)
  f.alloc->free(c, FreeOrder::kCompleted);
  DevicePtr live = f.get(8 * kMiB);  // [32, 40); [40, 48) stays free and mapped
  CHECK(live == c);
  f.alloc->free(a, FreeOrder::kCompleted);
  CHECK(f.alloc->release_cached() == 32 * kMiB);  // the hole [0, 32)
  DevicePtr other = f.get(32 * kMiB, kOther);      // 16 + 32 = 48 MiB mapped of 64
  DevicePtr p = 0;
  REQUIRE(f.alloc->allocate(24 * kMiB, kNoStream, &p) == Status::kOk);  // [40, 64): 16 MiB more
  CHECK(p == live + 8 * kMiB);
  CHECK(f.sim.used_bytes() == 64 * kMiB);
  std::memset(reinterpret_cast<void*>(p), 7, 24 * kMiB);
  for (DevicePtr q : {p, live, other}) f.alloc->free(q, FreeOrder::kCompleted);
}

TEST_CASE("a segment with nothing mapped left gives its address range back") {
  // Each (stream, pool) reserves the device's memory plus the limit in address space. Kept
  // for good, streams that come and go (a stream per request) would use up the address space,
  // and every new stream's first allocation would then fail.
  Fixture f;
  std::vector<DevicePtr> gone;
  for (StreamHandle s = 0x100; s < 0x108; ++s) {
    gone.push_back(f.get(4 * kMiB, s));
    f.alloc->free(gone.back(), FreeOrder::kStream, s);
  }
  const DevicePtr kept = f.get(4 * kMiB, 0x200);
  const std::size_t one = f.sim.reserved_address_bytes() / 9;
  CHECK(one >= 1 * kGiB);
  f.alloc->release_cached();
  CHECK(f.sim.used_bytes() == 4 * kMiB);
  CHECK(f.sim.reserved_address_bytes() == one);  // only the segment with a live block
  CHECK(f.stat("segment.all.current") == 1);
  for (DevicePtr p : gone) CHECK_FALSE(f.alloc->owns(p));
  // A stream whose range went back gets a new one at its next allocation.
  const DevicePtr again = f.get(4 * kMiB, 0x100);
  std::memset(reinterpret_cast<void*>(again), 5, 4 * kMiB);
  CHECK(f.sim.reserved_address_bytes() == 2 * one);
  f.alloc->free(again, FreeOrder::kCompleted);
  f.alloc->free(kept, FreeOrder::kCompleted);
  f.alloc->release_cached();
  CHECK(f.sim.reserved_address_bytes() == 0);
  CHECK(f.sim.used_bytes() == 0);
  CHECK(f.stat("segment.all.current") == 0);
}

TEST_CASE("a device without virtual memory gets plain segments, and the summary says why") {
  // Some vGPU and older setups have no virtual memory management: reserve and map are refused
  // there, so expandable segments would end every request that needs memory with that error.
  Fixture f(0, 1 * kGiB, false, /*virtual_memory=*/false);
  CHECK(f.alloc->expandable_ignored());
  CHECK_FALSE(f.alloc->options().expandable_segments);
  const DevicePtr large = f.get(6 * kMiB);
  const DevicePtr small = f.get(4096);
  std::memset(reinterpret_cast<void*>(large), 3, 6 * kMiB);
  std::memset(reinterpret_cast<void*>(small), 4, 4096);
  CHECK(f.sim.segment_calls() == 2);  // a 20 MiB segment of the large pool, 2 MiB of the small
  CHECK(f.sim.map_calls() == 0);
  CHECK(f.sim.reserved_address_bytes() == 0);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(22 * kMiB));
  CHECK(f.alloc->find(large)->segment_size == 20 * kMiB);
  f.alloc->free(large, FreeOrder::kCompleted);
  f.alloc->free(small, FreeOrder::kCompleted);
  CHECK(f.alloc->release_cached() == 22 * kMiB);
  CHECK(f.sim.used_bytes() == 0);
  CHECK_THAT(f.alloc->summary(),
             Catch::Contains("expandable_segments ignored: the device has no virtual memory management"));

  // A device with it keeps expandable segments, and the summary has no such line.
  Fixture g;
  CHECK_FALSE(g.alloc->expandable_ignored());
  CHECK(g.alloc->options().expandable_segments);
  g.get(6 * kMiB);
  CHECK(g.sim.map_calls() == 1);
  CHECK(g.sim.segment_calls() == 0);
  CHECK_THAT(g.alloc->summary(), !Catch::Contains("expandable_segments ignored"));
}
