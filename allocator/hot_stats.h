// A thread cache's statistics changes since they were last folded into the allocator's
// totals: what a cached allocate and free cost in statistics. Kept as counts of events per
// pool (blocks handed out, freed, made reusable), from which every current and cumulative
// figure follows, plus the peaks of the currents: two cache lines and about eight additions
// a pair, where a MemoryStats delta meant twenty Stat updates over fourteen lines.
//
// Every current of the five stats a thread cache moves (allocation, active, allocated,
// active and requested bytes) rises only when a block is handed out, so peaks are taken
// there and nowhere else. The "all" peaks equal the one pool's while a delta touches one pool
// (nearly always); they are tracked on their own from the moment a delta touches both.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "allocator/block.h"
#include "allocator/memory_stats.h"
#include "allocator/types.h"

namespace cudalloc {

class HotStats {
 public:
  // The block is handed to the program.
  CUDALLOC_INLINE void alloc(const Block* b, bool oversize) {
    Pool& d = touch(b);
    ++d.allocs;
    d.alloc_bytes += static_cast<std::int64_t>(b->size);
    d.alloc_requested += static_cast<std::int64_t>(b->requested);
    if (oversize) ++oversize_;
    raise(d.peak, d.currents());
    if (touched_ == kBothPools) [[unlikely]] raise(all_peak_, all_currents());
  }
  // The program freed the block (it stays active until it can be handed out again).
  CUDALLOC_INLINE void free(const Block* b, bool oversize) { count_free(touch(b), b, oversize); }
  // The block stops being active: it can be handed out again.
  CUDALLOC_INLINE void inactive(const Block* b) { count_inactive(touch(b), b); }
  // `n` small-pool blocks of `bytes` in all stop being active at once (a refill's run).
  CUDALLOC_INLINE void inactive_small(std::int64_t n, std::int64_t bytes) {
    Pool& d = touch_slot(slot_of(PoolKind::kSmall));
    d.inactives += n;
    d.inactive_bytes += bytes;
  }
  // Both at once: freed in stream order and reusable at once (one pool lookup).
  CUDALLOC_INLINE void free_reusable(const Block* b, bool oversize) {
    Pool& d = touch(b);
    count_free(d, b, oversize);
    count_inactive(d, b);
  }

  bool empty() const { return touched_ == 0; }  // every change touches a pool

  // Adds the changes to `into` and starts over. A peak is exact when no other thread moved the
  // same stat since the delta started.
  void fold_into(MemoryStats& into);

 private:
  enum Quantity : std::size_t { kAllocation, kActive, kAllocatedBytes, kActiveBytes, kRequestedBytes, kQuantities };
  using Values = std::array<std::int64_t, kQuantities>;
  static constexpr unsigned kBothPools = 3;

  struct alignas(64) Pool {
    std::int64_t allocs = 0, alloc_bytes = 0, alloc_requested = 0;
    std::int64_t frees = 0, free_bytes = 0, free_requested = 0;
    std::int64_t inactives = 0, inactive_bytes = 0;
    Values peak{};  // of currents(), since the delta started

    CUDALLOC_INLINE Values currents() const {
      return {allocs - frees, allocs - inactives, alloc_bytes - free_bytes, alloc_bytes - inactive_bytes,
              alloc_requested - free_requested};
    }
    // Cumulative amounts added to and taken from each stat.
    Values added() const { return {allocs, allocs, alloc_bytes, alloc_bytes, alloc_requested}; }
  };

  CUDALLOC_INLINE void count_free(Pool& d, const Block* b, bool oversize) {
    ++d.frees;
    d.free_bytes += static_cast<std::int64_t>(b->size);
    d.free_requested += static_cast<std::int64_t>(b->requested);
    if (oversize) --oversize_;
  }
  CUDALLOC_INLINE static void count_inactive(Pool& d, const Block* b) {
    ++d.inactives;
    d.inactive_bytes += static_cast<std::int64_t>(b->size);
  }

  // pools_' slot of a pool kind (its stats are at stat_index(kind)).
  static constexpr std::size_t slot_of(PoolKind kind) { return kind == PoolKind::kSmall ? 0 : 1; }

  CUDALLOC_INLINE Pool& touch(const Block* b) { return touch_slot(slot_of(b->pool)); }
  CUDALLOC_INLINE Pool& touch_slot(std::size_t p) {
    if (touched_ != 1u << p) [[unlikely]] note_pool(p);
    return pools_[p];
  }
  // A delta's first change, or a change to its second pool: until then the "all" peaks were
  // the first pool's.
  void note_pool(std::size_t p) {
    if (touched_ == 0) {
      touched_ = 1u << p;
    } else if (touched_ != kBothPools) {
      all_peak_ = pools_[touched_ == 1u ? 0 : 1].peak;
      touched_ = kBothPools;
    }
  }
  CUDALLOC_INLINE static void raise(Values& peak, const Values& now) {
    for (std::size_t q = 0; q < kQuantities; ++q) peak[q] = std::max(peak[q], now[q]);
  }
  Values all_currents() const {
    const Values a = pools_[0].currents();
    const Values b = pools_[1].currents();
    Values sum{};
    for (std::size_t q = 0; q < kQuantities; ++q) sum[q] = a[q] + b[q];
    return sum;
  }

  std::array<Pool, 2> pools_{};  // small, large
  Values all_peak_{};            // valid once both pools changed
  std::int64_t oversize_ = 0;
  unsigned touched_ = 0;  // a bit per pool changed since the last fold
};

}  // namespace cudalloc
