// How a block changing hands moves the allocator's statistics, on the locked path. Separate
// from memory_stats.h (the stats themselves and their formatting) because this is the
// allocator's accounting policy; the thread caches keep the same policy in a cheaper form
// (hot_stats.h).
#pragma once

#include <cstdint>

#include "allocator/block.h"
#include "allocator/memory_stats.h"

namespace cudalloc {

inline void add_stat(StatArray& a, PoolKind k, std::int64_t n) {
  a[kStatAll].increase(n);
  a[stat_index(k)].increase(n);
}
inline void sub_stat(StatArray& a, PoolKind k, std::int64_t n) {
  a[kStatAll].decrease(n);
  a[stat_index(k)].decrease(n);
}

// The block is handed to the program.
inline void account_alloc(MemoryStats& s, const Block* b, bool oversize) {
  const PoolKind k = b->segment->pool;
  const auto size = static_cast<std::int64_t>(b->size);
  add_stat(s.allocation, k, 1);
  add_stat(s.active, k, 1);
  add_stat(s.allocated_bytes, k, size);
  add_stat(s.active_bytes, k, size);
  add_stat(s.requested_bytes, k, static_cast<std::int64_t>(b->requested));
  if (oversize) ++s.oversize_allocations;
}
// The program freed the block (it stays active until it can be handed out again).
inline void account_free(MemoryStats& s, const Block* b, bool oversize) {
  const PoolKind k = b->segment->pool;
  sub_stat(s.allocation, k, 1);
  sub_stat(s.allocated_bytes, k, static_cast<std::int64_t>(b->size));
  sub_stat(s.requested_bytes, k, static_cast<std::int64_t>(b->requested));
  if (oversize) --s.oversize_allocations;
}
// The block stops being active: it can be handed out again.
inline void account_inactive(MemoryStats& s, const Block* b) {
  sub_stat(s.active, b->segment->pool, 1);
  sub_stat(s.active_bytes, b->segment->pool, static_cast<std::int64_t>(b->size));
}

}  // namespace cudalloc
