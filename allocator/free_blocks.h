// The allocator's free blocks: the small and large pools of mapped blocks, the pool of unmapped
// ranges of expandable segments, and coalescing. A block put back is merged with its free
// neighbours (of the same mapping) before it joins its pool. Separate from the allocation
// ladder and the segment code so that one class owns the invariant "a free block is in exactly
// one pool, never next to another free block of the same mapping", together with the
// inactive-split statistics that follow it. Used under the device lock only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "allocator/block.h"
#include "allocator/block_pool.h"
#include "allocator/memory_stats.h"
#include "allocator/size_classes.h"
#include "allocator/unmap_clock.h"

namespace cudalloc {

class FreeBlocks {
 public:
  // `tick` is the allocator's clock, stamped on a segment when it becomes wholly free.
  FreeBlocks(const SizeClasses& sizes, MemoryStats& stats, const std::uint64_t& tick)
      : sizes_(sizes), stats_(stats), tick_(tick) {}
  FreeBlocks(const FreeBlocks&) = delete;
  FreeBlocks& operator=(const FreeBlocks&) = delete;

  // Puts a free block into its pool, as it is (no merging).
  void insert(Block* b);
  // Takes a block out of its pool.
  void erase(Block* b);
  // The best fitting free block of `stream` that may serve `rounded`, out of its pool.
  Block* find(StreamHandle stream, std::size_t rounded, PoolKind kind);
  // Merges a free block with free neighbours and puts it in its pool. A block of an expandable
  // segment is stamped with the clock's era (set_unmap_clock) first.
  void make_reusable(Block* b);
  void set_unmap_clock(UnmapClock* clock) { clock_ = clock; }

  // Splits `b` at `offset`; the new block after it shares its state and mapping.
  static Block* split_at(Block* b, std::size_t offset);

  std::size_t largest() const { return std::max(small_.largest(), large_.largest()); }
  // Bytes of mapped free blocks (cached, fragmented or not).
  std::size_t bytes() const { return small_.bytes() + large_.bytes(); }
  void clear() {
    small_.clear();
    large_.clear();
    unmapped_.clear();
  }

 private:
  BlockPool& pool(PoolKind kind) { return kind == PoolKind::kSmall ? small_ : large_; }
  // The inactive-split statistics of a mapped block leaving its pool.
  void left_pool(const Block* b);

  const SizeClasses& sizes_;
  MemoryStats& stats_;
  const std::uint64_t& tick_;
  BlockPool small_;
  BlockPool large_;
  BlockPool unmapped_;  // unbacked free ranges of expandable segments
  UnmapClock* clock_ = nullptr;
};

}  // namespace cudalloc
