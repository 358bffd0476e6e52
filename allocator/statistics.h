// The allocator's statistics (memory_stats.h): the totals, kept on the locked path, and the
// thread caches' hot-path deltas folded into them (thread_cache.h, hot_stats.h). The locked path
// folds every thread's delta before it changes the totals, so that a peak is never taken over
// totals that miss another thread's frees. Under the device lock.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/memory_stats.h"
#include "allocator/thread_cache.h"

namespace cudalloc {

class Statistics {
 public:
  MemoryStats totals;

  // Folds in every thread's delta. A cache whose delta has not changed since its last fold is
  // skipped without taking its lock (ThreadCache::changed).
  void merge(const std::vector<std::shared_ptr<ThreadCache>>& caches) {
    for (const auto& cache : caches) {
      if (!cache->changed()) continue;
      std::lock_guard lock(cache->lock);
      cache->fold_into(totals);
    }
  }
  // Folds in one cache's delta; the caller holds its lock.
  void fold(ThreadCache& cache) { cache.fold_into(totals); }

  // Bytes in live blocks, once merged.
  std::size_t allocated() const { return static_cast<std::size_t>(totals.allocated_bytes[kStatAll].current); }

  // The context went, and its memory with it (forget_all): what is held falls to zero, the
  // counts of what happened stay.
  void forget_memory() { totals.forget_held(); }
};

}  // namespace cudalloc
