// Folding a thread cache's statistics delta into the allocator's totals (see hot_stats.h).
#include "allocator/hot_stats.h"

#include <algorithm>
#include <cstddef>

namespace cudalloc {

namespace {

// Adds a delta whose current moved by `current`, rose to at most `peak` above where it started,
// and was added to by `added` in all.
void add_delta(Stat& into, std::int64_t current, std::int64_t peak, std::int64_t added) {
  into.peak = std::max(into.peak, into.current + peak);
  into.current += current;
  into.allocated += added;
  into.freed += added - current;
}

}  // namespace

void HotStats::fold_into(MemoryStats& into) {
  StatArray MemoryStats::*arrays[kQuantities] = {&MemoryStats::allocation, &MemoryStats::active,
                                                 &MemoryStats::allocated_bytes, &MemoryStats::active_bytes,
                                                 &MemoryStats::requested_bytes};
  Values all_current{};
  Values all_added{};
  for (const PoolKind kind : {PoolKind::kSmall, PoolKind::kLarge}) {
    const std::size_t p = slot_of(kind);
    if ((touched_ & (1u << p)) == 0) continue;
    const Pool& d = pools_[p];
    const Values current = d.currents();
    const Values added = d.added();
    const std::size_t index = stat_index(kind);
    for (std::size_t q = 0; q < kQuantities; ++q) {
      add_delta((into.*arrays[q])[index], current[q], d.peak[q], added[q]);
      all_current[q] += current[q];
      all_added[q] += added[q];
    }
  }
  if (touched_ != 0) {
    const Values& all_peak = touched_ == kBothPools ? all_peak_ : pools_[touched_ == 1u ? 0 : 1].peak;
    for (std::size_t q = 0; q < kQuantities; ++q) {
      add_delta((into.*arrays[q])[kStatAll], all_current[q], all_peak[q], all_added[q]);
    }
  }
  into.oversize_allocations += oversize_;
  *this = HotStats{};
}

}  // namespace cudalloc
