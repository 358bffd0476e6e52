// Folding a thread cache's statistics deltas into the allocator's totals (see allocator_stats.h).
#include "allocator/allocator_stats.h"

#include <algorithm>
#include <cstddef>

namespace cudalloc {

namespace {

void merge_stat(Stat& into, Stat& d) {
  into.peak = std::max(into.peak, into.current + d.peak);
  into.current += d.current;
  into.allocated += d.allocated;
  into.freed += d.freed;
  d = Stat{};
}

}  // namespace

void merge_stats(MemoryStats& into, MemoryStats& d) {
  StatArray MemoryStats::*arrays[] = {&MemoryStats::allocation, &MemoryStats::active,
                                      &MemoryStats::allocated_bytes, &MemoryStats::active_bytes,
                                      &MemoryStats::requested_bytes};
  for (auto member : arrays) {
    for (std::size_t t = 0; t < kStatTypes; ++t) merge_stat((into.*member)[t], (d.*member)[t]);
  }
  into.oversize_allocations += d.oversize_allocations;
  d.oversize_allocations = 0;
}

}  // namespace cudalloc
