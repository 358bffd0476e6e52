// Random allocate/free sequences checked against a plain model after every step.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"
#include "allocator/size_classes.h"

using namespace cudalloc;

namespace {

struct Live {
  DevicePtr ptr;
  std::size_t requested;
  std::size_t size;
  StreamHandle stream;
};

constexpr StreamHandle kStreams[] = {kNoStream, 0, 0x100, 0x200};

AllocatorOptions random_options(std::mt19937_64& rng) {
  AllocatorOptions o;
  switch (rng() % 3) {
    case 0: break;
    case 1: o.max_split_size = (20 + rng() % 100) * kMiB; break;
    case 2: o.max_split_size = 40 * kMiB; break;
  }
  if (rng() % 3 == 0) o.garbage_collection_threshold = 0.3 + 0.6 * static_cast<double>(rng() % 100) / 100.0;
  if (rng() % 3 == 0) o.roundup_power2_divisions.fill(std::size_t{1} << (rng() % 4));
  if (rng() % 2 == 0) o.memory_limit_bytes = (64 + rng() % 512) * kMiB;
  if (rng() % 4 == 0) o.per_process_memory_fraction = 0.5;
  o.thread_cache = rng() % 2 == 0;
  o.expandable_segments = rng() % 3 == 0;
  o.page_stitching = o.expandable_segments && rng() % 2 == 0;
  return o;
}

std::size_t random_size(std::mt19937_64& rng) {
  // Log-uniform from 1 B to 64 MiB.
  std::uniform_real_distribution<double> d(0.0, std::log2(64.0 * kMiB));
  return std::max<std::size_t>(1, static_cast<std::size_t>(std::exp2(d(rng))));
}

// `ceiling`: reserved memory may exceed the limit only if it already did before this step (a
// limit lowered below what is reserved); no step grows it past the limit.
void check_invariants(const std::map<int, Live>& live, DeviceAllocator& alloc, SimBackend& sim,
                      std::size_t ceiling) {
  const auto stats = alloc.stats().to_map();
  std::int64_t allocated = 0;
  std::int64_t requested = 0;
  DevicePtr previous_end = 0;
  std::map<DevicePtr, const Live*> by_address;
  for (const auto& [id, l] : live) by_address[l.ptr] = &l;
  for (const auto& [ptr, l] : by_address) {
    REQUIRE(ptr % kMinBlockSize == 0);
    REQUIRE(l->size >= l->requested);
    REQUIRE(ptr >= previous_end);  // live blocks never overlap
    previous_end = ptr + l->size;
    allocated += static_cast<std::int64_t>(l->size);
    requested += static_cast<std::int64_t>(l->requested);
  }
  REQUIRE(stats.at("allocated_bytes.all.current") == allocated);
  REQUIRE(stats.at("requested_bytes.all.current") == requested);
  REQUIRE(stats.at("allocation.all.current") == static_cast<std::int64_t>(live.size()));
  const std::int64_t reserved = stats.at("reserved_bytes.all.current");
  REQUIRE(reserved == static_cast<std::int64_t>(sim.used_bytes()));
  REQUIRE(static_cast<std::size_t>(reserved) <= ceiling);
  REQUIRE(stats.at("active_bytes.all.current") >= allocated);
  REQUIRE(stats.at("active_bytes.all.current") + stats.at("inactive_split_bytes.all.current") <= reserved);
  REQUIRE(stats.at("reserved_bytes.small_pool.current") + stats.at("reserved_bytes.large_pool.current") == reserved);
}

void run_sequence(std::uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  const AllocatorOptions options = random_options(rng);
  SimOptions so;
  so.host_memory = false;
  so.total_memory = (256 + rng() % 1024) * kMiB;
  SimBackend sim(so);
  DeviceAllocator alloc(sim, options);
  std::map<int, Live> live;
  int next_id = 0;
  std::int64_t ooms = 0;

  for (int step = 0; step < steps; ++step) {
    const std::size_t reserved_before = sim.used_bytes();
    const unsigned op = rng() % 100;
    if (op < 45 || live.empty()) {
      const std::size_t bytes = random_size(rng);
      const StreamHandle stream = kStreams[rng() % 4];
      DevicePtr p = 0;
      const Status st = alloc.allocate(bytes, stream, &p);
      if (st == Status::kOk) {
        // A block may be larger than the rounded request when the remainder was too small to
        // split off: by at most 1 MiB, or by under 20 MiB for an unsplit oversize block.
        const std::size_t rounded = SizeClasses(options).round(bytes);
        const auto info = alloc.find(p);
        REQUIRE(info.has_value());
        REQUIRE(info->base == p);
        REQUIRE(info->requested == bytes);
        REQUIRE(info->size >= rounded);
        REQUIRE(info->size - rounded < (rounded >= options.max_split_size ? kLargeBuffer : kSmallSize + 1));
        live[next_id++] = Live{p, bytes, info->size, stream};
      } else {
        REQUIRE(st == Status::kOutOfMemory);
        REQUIRE(p == 0);
        ++ooms;
        REQUIRE(alloc.last_oom().has_value());
        REQUIRE(alloc.last_oom()->requested == bytes);
      }
    } else if (op < 85) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const Live l = it->second;
      live.erase(it);
      Status st = Status::kOk;
      switch (rng() % 4) {
        case 0: st = alloc.free(l.ptr, FreeOrder::kDevice); break;
        case 1: st = alloc.free(l.ptr, FreeOrder::kCompleted); break;
        case 2: st = alloc.free(l.ptr, FreeOrder::kStream, l.stream == kNoStream ? 0 : l.stream); break;
        case 3: st = alloc.free(l.ptr, FreeOrder::kStream, kStreams[1 + rng() % 3]); break;
      }
      REQUIRE(st == Status::kOk);
      // A second free of the same pointer is refused unless the address was handed out again.
      bool reissued = false;
      for (const auto& [id, other] : live) reissued |= other.ptr == l.ptr;
      if (!reissued) REQUIRE(alloc.free(l.ptr, FreeOrder::kDevice) == Status::kInvalidValue);
    } else if (op < 90) {
      sim.enqueue(kStreams[1 + rng() % 3]);
    } else if (op < 94) {
      sim.run(kStreams[1 + rng() % 3], rng() % 3);
    } else if (op < 96) {
      const Live& l = std::next(live.begin(), static_cast<long>(rng() % live.size()))->second;
      if (l.size > kMinBlockSize) {  // an interior pointer is refused
        REQUIRE(alloc.free(l.ptr + kMinBlockSize, FreeOrder::kDevice) == Status::kInvalidValue);
      }
      if (l.stream != kNoStream) REQUIRE(alloc.record_stream(l.ptr, kStreams[1 + rng() % 3]) == Status::kOk);
    } else if (op < 97) {
      alloc.release_cached();
    } else if (op < 98) {
      sim.fail_after(SimOp::kAllocate, rng() % 3);
    } else if (op < 99) {
      alloc.set_memory_limit(rng() % 2 ? 0 : (32 + rng() % 256) * kMiB);
    } else {
      sim.run_all();
    }
    check_invariants(live, alloc, sim, std::max(alloc.memory_limit(), reserved_before));
  }
  REQUIRE(alloc.stats().num_ooms == ooms);
  for (const auto& [id, l] : live) REQUIRE(alloc.free(l.ptr, FreeOrder::kDevice) == Status::kOk);
  live.clear();
  alloc.set_memory_limit(0);
  alloc.release_cached();
  check_invariants(live, alloc, sim, alloc.memory_limit());
  REQUIRE(alloc.stats().to_map().at("reserved_bytes.all.current") == 0);
  REQUIRE(sim.used_bytes() == 0);
}

}  // namespace

TEST_CASE("thousands of short random sequences match the model") {
  for (int seed = 1; seed <= 2000; ++seed) {
    INFO("seed " << seed);
    run_sequence(static_cast<std::uint64_t>(seed), 200);
  }
}

TEST_CASE("long random sequences match the model") {
  for (int seed = 100001; seed <= 100010; ++seed) {
    INFO("seed " << seed);
    run_sequence(static_cast<std::uint64_t>(seed), 4000);
  }
}

// Two allocators of one device sharing its budget (two contexts): whatever they do, device
// faults included (a refused segment, map, unmap or free), and a context's end, the budget
// holds exactly the bytes both reserve. Fails if a path that reserves or gives back memory
// misses the budget (a failed free that keeps its segment, an unmap, a refused map, forget_all).
TEST_CASE("a shared device budget stays equal to what its allocators reserve") {
  for (int seed = 1; seed <= 1000; ++seed) {
    INFO("seed " << seed);
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
    auto budget = std::make_shared<DeviceBudget>();
    struct Context {
      explicit Context(const AllocatorOptions& o) : options(o), alloc(sim, options) {}
      AllocatorOptions options;
      SimBackend sim;
      DeviceAllocator alloc;
      std::vector<std::pair<DevicePtr, StreamHandle>> live;
    };
    std::vector<std::unique_ptr<Context>> contexts;
    for (int i = 0; i < 2; ++i) {
      AllocatorOptions o = random_options(rng);
      o.memory_limit_bytes = (64 + rng() % 128) * kMiB;
      contexts.push_back(std::make_unique<Context>(o));
      contexts.back()->alloc.share_budget(budget);
    }
    for (int step = 0; step < 300; ++step) {
      Context& c = *contexts[rng() % 2];
      const int op = static_cast<int>(rng() % 100);
      if (op < 45) {
        const std::size_t bytes = rng() % 4 == 0 ? 1 + rng() % (40 * kMiB) : 1 + rng() % kMiB;
        const StreamHandle stream = kStreams[rng() % 4];
        DevicePtr p = 0;
        if (c.alloc.allocate(bytes, stream, &p) == Status::kOk) c.live.emplace_back(p, stream);
      } else if (op < 80 && !c.live.empty()) {
        const std::size_t i = rng() % c.live.size();
        const auto [p, stream] = c.live[i];
        c.live.erase(c.live.begin() + static_cast<std::ptrdiff_t>(i));
        const FreeOrder order = rng() % 3 == 0 ? FreeOrder::kDevice : rng() % 2 ? FreeOrder::kCompleted : FreeOrder::kStream;
        REQUIRE(c.alloc.free(p, order, stream == kNoStream ? 0 : stream) == Status::kOk);
      } else if (op < 84) {
        c.alloc.release_cached(rng() % 2 ? 0 : 8 * kMiB);
      } else if (op < 88) {
        c.sim.fail_after(static_cast<SimOp>(rng() % 5), rng() % 3);
      } else if (op < 90) {
        c.alloc.set_memory_limit(rng() % 2 ? 0 : (32 + rng() % 128) * kMiB);
      } else if (op < 91) {
        c.alloc.forget_all();
        c.live.clear();
      } else {
        c.sim.run_all();
      }
      std::size_t reserved = 0;
      for (const auto& x : contexts) reserved += static_cast<std::size_t>(x->alloc.stats().reserved_bytes[kStatAll].current);
      REQUIRE(budget->held() == reserved);
    }
  }
}
