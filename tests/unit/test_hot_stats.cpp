#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "allocator/allocator_stats.h"
#include "allocator/hot_stats.h"

using namespace cudalloc;

namespace {

// A block's life as the thread cache sees it: handed out, freed, made reusable again.
enum class Phase { kIdle, kAllocated, kFreed };

struct Fixture {
  Segment small_segment;
  Segment large_segment;
  std::vector<Block> blocks;
  std::vector<Phase> phases;
  MemoryStats reference;  // every change applied at once, as the locked path does
  MemoryStats folded;     // the same changes through a HotStats delta
  HotStats delta;

  explicit Fixture(std::mt19937_64& rng) : blocks(64), phases(64, Phase::kIdle) {
    small_segment.pool = PoolKind::kSmall;
    large_segment.pool = PoolKind::kLarge;
    for (Block& b : blocks) {
      const bool large = rng() % 3 == 0;
      b.segment = large ? &large_segment : &small_segment;
      b.pool = b.segment->pool;
      b.size = large ? (1 + rng() % 64) * (1u << 20) : (1 + rng() % 2048) * 512;
    }
  }

  void step(std::mt19937_64& rng, bool one_pool) {
    const std::size_t i = rng() % blocks.size();
    Block& b = blocks[i];
    if (one_pool && b.segment->pool != PoolKind::kSmall) return;
    const bool oversize = b.size >= 8 * (1u << 20);
    switch (phases[i]) {
      case Phase::kIdle:
        b.requested = b.size - rng() % 512;
        account_alloc(reference, &b, oversize);
        delta.alloc(&b, oversize);
        phases[i] = Phase::kAllocated;
        break;
      case Phase::kAllocated:
        account_free(reference, &b, oversize);
        delta.free(&b, oversize);
        phases[i] = Phase::kFreed;
        break;
      case Phase::kFreed:
        account_inactive(reference, &b);
        delta.inactive(&b);
        phases[i] = Phase::kIdle;
        break;
    }
  }

  void check_folded() {
    delta.fold_into(folded);
    CHECK(delta.empty());
    CHECK(folded.to_map() == reference.to_map());
  }
};

}  // namespace

TEST_CASE("a folded hot delta gives the totals of the same changes made on the totals") {
  for (const bool one_pool : {true, false}) {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      INFO("seed " << seed << (one_pool ? ", small pool only" : ", both pools"));
      std::mt19937_64 rng(seed);
      Fixture f(rng);
      for (int round = 0; round < 50; ++round) {
        const int steps = static_cast<int>(rng() % 200);
        for (int s = 0; s < steps; ++s) f.step(rng, one_pool);
        f.check_folded();
      }
    }
  }
}

TEST_CASE("the all-pool peak of a delta that mixes pools is the peak of their sum") {
  std::mt19937_64 rng(7);
  Fixture f(rng);
  Block& small = f.blocks[0];
  Block& large = f.blocks[1];
  small.segment = &f.small_segment;
  small.pool = PoolKind::kSmall;
  small.size = small.requested = 4096;
  large.segment = &f.large_segment;
  large.pool = PoolKind::kLarge;
  large.size = large.requested = 1u << 20;
  // Small rises to 4096 and falls; large then rises to 1 MiB: the sum never exceeds 1 MiB,
  // though the pools' own peaks add up to more.
  f.delta.alloc(&small, false);
  f.delta.free(&small, false);
  f.delta.alloc(&large, false);
  f.delta.fold_into(f.folded);
  CHECK(f.folded.allocated_bytes[kStatAll].peak == static_cast<std::int64_t>(1u << 20));
  CHECK(f.folded.allocated_bytes[stat_index(PoolKind::kSmall)].peak == 4096);
  CHECK(f.folded.allocated_bytes[kStatAll].current == static_cast<std::int64_t>(1u << 20));
  CHECK(f.folded.allocated_bytes[kStatAll].freed == 4096);
}
