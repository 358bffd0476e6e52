// Page stitching (expandable segments, page_stitching): growth takes the free pages of other
// blocks before new memory, never while queued device work may still use them, and rolls
// back exactly when the device refuses.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"

using namespace cudalloc;

namespace {

constexpr StreamHandle kStreamA = 0x10;
constexpr StreamHandle kStreamB = 0x20;
constexpr std::size_t kPage = 2 * kMiB;

struct Fixture {
  explicit Fixture(std::size_t limit = 0, std::size_t total = 1 * kGiB, std::size_t page = 0) : sim(make_sim(total)) {
    options.page_stitching = true;
    options.stitch_page_bytes = page;
    options.memory_limit_bytes = limit;
    options.thread_cache = false;
    alloc = std::make_unique<DeviceAllocator>(sim, options);
  }
  static SimOptions make_sim(std::size_t total) {
    SimOptions so;
    so.total_memory = total;
    return so;
  }
  DevicePtr get(std::size_t bytes, StreamHandle stream = kStreamA) {
    DevicePtr p = 0;
    REQUIRE(alloc->allocate(bytes, stream, &p) == Status::kOk);
    return p;
  }
  void put(DevicePtr p, StreamHandle stream = kStreamA) { REQUIRE(alloc->free(p, FreeOrder::kStream, stream) == Status::kOk); }
  std::int64_t stat(const char* key) { return alloc->stats().to_map().at(key); }
  std::int64_t reserved() { return stat("reserved_bytes.all.current"); }

  AllocatorOptions options;
  SimBackend sim;
  std::unique_ptr<DeviceAllocator> alloc;
};

void fill(DevicePtr p, std::size_t bytes, std::uint8_t v) { std::memset(reinterpret_cast<void*>(p), v, bytes); }

bool holds(DevicePtr p, std::size_t bytes, std::uint8_t v) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < bytes; i += 4096) {
    if (b[i] != v) return false;
  }
  return b[bytes - 1] == v;
}

}  // namespace

TEST_CASE("a growth takes the free pages of holes instead of new memory") {
  Fixture f;
  // Four 8 MiB blocks side by side; the 1st and 3rd are freed: two 8 MiB holes, too small
  // for a 16 MiB request in one piece.
  DevicePtr a = f.get(8 * kMiB), b = f.get(8 * kMiB), c = f.get(8 * kMiB), d = f.get(8 * kMiB);
  fill(b, 8 * kMiB, 0xb);
  fill(d, 8 * kMiB, 0xd);
  f.put(a);
  f.put(c);
  const std::int64_t before = f.reserved();
  CHECK(before == static_cast<std::int64_t>(32 * kMiB));
  DevicePtr e = f.get(16 * kMiB);
  CHECK(f.reserved() == before);  // no new memory
  CHECK(f.sim.used_bytes() == static_cast<std::size_t>(before));
  CHECK(f.sim.remapped_pages() == 8);
  CHECK(f.stat("num_remapped_pages") == 8);
  CHECK(f.stat("num_remaps") == 1);
  fill(e, 16 * kMiB, 0xe);
  // The live blocks kept their contents, and each page of every block is its own.
  CHECK(holds(b, 8 * kMiB, 0xb));
  CHECK(holds(d, 8 * kMiB, 0xd));
  CHECK(holds(e, 16 * kMiB, 0xe));
  std::set<std::uint64_t> physical;
  for (DevicePtr blk : {b, d, e}) {
    const std::size_t n = blk == e ? 8 : 4;
    for (std::size_t i = 0; i < n; ++i) CHECK(physical.insert(f.sim.physical_at(blk + i * kPage)).second);
  }
  // The holes are address space again: nothing there is accessible.
  CHECK_FALSE(f.sim.is_accessible(a, kPage));
  CHECK_FALSE(f.sim.is_accessible(c, kPage));
  // A context that goes takes its memory, not the counts of what happened.
  f.alloc->forget_all();
  CHECK(f.reserved() == 0);
  CHECK(f.stat("num_remaps") == 1);
  CHECK(f.stat("num_remapped_pages") == 8);
}

TEST_CASE("pages of several granules move whole") {
  Fixture f(0, 1 * kGiB, 4 * kMiB);
  DevicePtr a = f.get(8 * kMiB), b = f.get(8 * kMiB), c = f.get(6 * kMiB), d = f.get(10 * kMiB);
  fill(b, 8 * kMiB, 0xb);
  fill(d, 10 * kMiB, 0xd);
  CHECK(f.reserved() == static_cast<std::int64_t>(32 * kMiB));
  f.put(a);
  f.put(c);
  // a's two pages and the one whole page inside c's [16, 22) MiB: 12 MiB to move, 4 new.
  DevicePtr e = f.get(16 * kMiB);
  CHECK(f.reserved() == static_cast<std::int64_t>(36 * kMiB));
  CHECK(f.sim.remapped_pages() == 3);
  // One physical allocation spans both granules of a page.
  CHECK(f.sim.physical_at(e) == f.sim.physical_at(e + 2 * kMiB));
  CHECK(f.sim.physical_at(e) != f.sim.physical_at(e + 4 * kMiB));
  fill(e, 16 * kMiB, 0xe);
  CHECK(holds(b, 8 * kMiB, 0xb));
  CHECK(holds(d, 10 * kMiB, 0xd));
}

TEST_CASE("without page stitching the same requests need new memory") {
  Fixture f;
  f.alloc.reset();
  f.options.page_stitching = false;
  f.options.expandable_segments = true;
  f.alloc = std::make_unique<DeviceAllocator>(f.sim, f.options);
  DevicePtr a = f.get(8 * kMiB), b = f.get(8 * kMiB), c = f.get(8 * kMiB), d = f.get(8 * kMiB);
  f.put(a);
  f.put(c);
  f.get(16 * kMiB);
  CHECK(f.reserved() == static_cast<std::int64_t>(48 * kMiB));
  CHECK(f.sim.remapped_pages() == 0);
  (void)b;
  (void)d;
}

TEST_CASE("free pages of the small pool serve the large pool and other streams") {
  Fixture f;
  // Fill two pages of the small pool, then free everything in it.
  std::vector<DevicePtr> small;
  for (int i = 0; i < 8; ++i) small.push_back(f.get(512 * 1024, kStreamB));
  for (DevicePtr p : small) f.put(p, kStreamB);
  CHECK(f.reserved() == static_cast<std::int64_t>(2 * kPage));
  DevicePtr big = f.get(4 * kMiB, kStreamA);
  CHECK(f.reserved() == static_cast<std::int64_t>(2 * kPage));
  CHECK(f.stat("reserved_bytes.large_pool.current") == static_cast<std::int64_t>(2 * kPage));
  CHECK(f.stat("reserved_bytes.small_pool.current") == 0);
  fill(big, 4 * kMiB, 7);
  CHECK(holds(big, 4 * kMiB, 7));
}

TEST_CASE("below the most ever held, growth maps new pages and moves none") {
  Fixture f;
  DevicePtr x = f.get(16 * kMiB), y = f.get(8 * kMiB);
  f.put(x);
  f.sim.run_all();
  f.alloc->release_cached(0);  // x's pages go back: 8 MiB held, 24 MiB the most ever
  CHECK(f.reserved() == static_cast<std::int64_t>(8 * kMiB));
  f.sim.enqueue_access(kStreamA, y, 8 * kMiB);
  f.get(16 * kMiB);
  CHECK(f.reserved() == static_cast<std::int64_t>(24 * kMiB));
  CHECK(f.sim.remapped_pages() == 0);
  f.sim.run_all();
  CHECK(f.sim.unsafe_unmaps() == 0);
}

TEST_CASE("a growth that would raise the peak waits for pages the device still uses") {
  Fixture f;
  DevicePtr a = f.get(8 * kMiB), b = f.get(8 * kMiB);
  // Work queued on the stream still uses `a` when it is freed in stream order.
  f.sim.enqueue_access(kStreamA, a, 8 * kMiB);
  f.put(a);
  DevicePtr c = f.get(16 * kMiB);
  CHECK(f.sim.remapped_pages() == 4);
  CHECK(f.reserved() == static_cast<std::int64_t>(24 * kMiB));
  CHECK(f.sim.unsafe_unmaps() == 0);  // the queued access ran before its pages moved
  CHECK(f.sim.bad_accesses() == 0);
  fill(c, 16 * kMiB, 1);
  f.sim.run_all();
  CHECK(f.sim.bad_accesses() == 0);
  (void)b;
}

TEST_CASE("a refused remap moves nothing and the request is served all the same") {
  Fixture f;
  DevicePtr a = f.get(8 * kMiB), b = f.get(8 * kMiB), c = f.get(8 * kMiB);
  fill(b, 8 * kMiB, 0xb);
  fill(c, 8 * kMiB, 0xc);
  f.put(a);
  f.sim.fail_after(SimOp::kRemap, 0);
  DevicePtr d = 0;
  REQUIRE(f.alloc->allocate(16 * kMiB, kStreamA, &d) == Status::kOk);
  fill(d, 16 * kMiB, 0xd);
  CHECK(holds(b, 8 * kMiB, 0xb));
  CHECK(holds(c, 8 * kMiB, 0xc));
  CHECK(f.sim.used_bytes() == static_cast<std::size_t>(f.reserved()));
  CHECK(f.sim.unsafe_unmaps() == 0);
}

TEST_CASE("a failed map of new pages leaves the holes where they were") {
  Fixture f(0, 40 * kMiB);
  DevicePtr a = f.get(8 * kMiB), b = f.get(8 * kMiB), c = f.get(8 * kMiB);
  fill(b, 8 * kMiB, 0xb);
  f.put(a);
  f.put(c);
  // 16 MiB of holes and 16 MiB of device left; a 32 MiB request needs 8 new pages.
  f.sim.fail_after(SimOp::kMap, 0);
  DevicePtr d = 0;
  const Status st = f.alloc->allocate(32 * kMiB, kStreamA, &d);
  CHECK(f.sim.used_bytes() == static_cast<std::size_t>(f.reserved()));
  CHECK(holds(b, 8 * kMiB, 0xb));
  if (st == Status::kOk) {
    fill(d, 32 * kMiB, 0xd);
    CHECK(holds(b, 8 * kMiB, 0xb));
  }
  CHECK(f.sim.unsafe_unmaps() == 0);
}

TEST_CASE("no page moves during a stream capture") {
  Fixture f;
  DevicePtr a = f.get(8 * kMiB), b = f.get(8 * kMiB);
  f.put(a);
  f.sim.set_capturing(true);
  f.get(16 * kMiB);
  CHECK(f.sim.remapped_pages() == 0);
  CHECK(f.reserved() == static_cast<std::int64_t>(32 * kMiB));
  f.sim.set_capturing(false);
  (void)b;
}

TEST_CASE("memory given back after stitching leaves the device holding nothing") {
  Fixture f;
  std::vector<DevicePtr> live;
  for (int i = 0; i < 6; ++i) live.push_back(f.get((3 + i) * kMiB));
  f.put(live[1]);
  f.put(live[3]);
  live.push_back(f.get(12 * kMiB));
  for (std::size_t i = 0; i < live.size(); ++i) {
    if (i != 1 && i != 3) f.put(live[i]);
  }
  f.alloc->release_cached(0);
  CHECK(f.reserved() == 0);
  CHECK(f.sim.used_bytes() == 0);
}

// Random programs on two streams with device work that lags: after every step each live block
// is mapped and holds its own contents, memory held matches the device's, and at the end no
// page was ever pulled from under queued work.
TEST_CASE("property: stitching never moves memory in use") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    std::mt19937_64 rng(seed);
    const std::size_t limit = seed % 3 == 0 ? 160 * kMiB : 0;
    Fixture f(limit, 512 * kMiB, seed % 4 == 1 ? 4 * kMiB : 0);
    struct Live {
      DevicePtr ptr;
      std::size_t bytes;
      StreamHandle stream;
      std::uint8_t tag;
    };
    std::map<int, Live> live;
    int next_id = 0;
    for (int step = 0; step < 400; ++step) {
      const unsigned op = rng() % 10;
      if (op < 5 || live.empty()) {
        std::uniform_real_distribution<double> d(9.0, 25.0);  // 512 B .. 32 MiB, log-uniform
        const std::size_t bytes = static_cast<std::size_t>(std::exp2(d(rng)));
        const StreamHandle s = rng() % 2 ? kStreamA : kStreamB;
        DevicePtr p = 0;
        if (f.alloc->allocate(bytes, s, &p) != Status::kOk) continue;
        const auto tag = static_cast<std::uint8_t>(1 + next_id % 250);
        fill(p, bytes, tag);
        live[next_id++] = Live{p, bytes, s, tag};
      } else if (op < 9) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        const Live l = it->second;
        REQUIRE(holds(l.ptr, l.bytes, l.tag));
        // The device may still read it after the free, in stream order.
        f.sim.enqueue_access(l.stream, l.ptr, l.bytes);
        REQUIRE(f.alloc->free(l.ptr, FreeOrder::kStream, l.stream) == Status::kOk);
        live.erase(it);
      } else {
        if (rng() % 3 == 0) {
          f.sim.run_all();
        } else {
          f.sim.run(rng() % 2 ? kStreamA : kStreamB, rng() % 8);
        }
      }
      REQUIRE(f.sim.used_bytes() == static_cast<std::size_t>(f.reserved()));
      if (limit != 0) REQUIRE(f.sim.used_bytes() <= limit);
      for (const auto& [id, l] : live) REQUIRE(f.sim.is_accessible(l.ptr, l.bytes));
    }
    for (const auto& [id, l] : live) REQUIRE(holds(l.ptr, l.bytes, l.tag));
    f.sim.run_all();
    CHECK(f.sim.unsafe_unmaps() == 0);
    CHECK(f.sim.bad_accesses() == 0);
    CHECK(f.stat("num_remapped_pages") > 0);
  }
}
