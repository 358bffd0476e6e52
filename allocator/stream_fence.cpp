#include "allocator/stream_fence.h"

namespace cudalloc {

void FenceQueue::track(Block* block) {
  if (block->pending_fences++ == 0) {
    pending_bytes_ += block->size;
    pool_pending_bytes_[pool_index(block)] += block->size;
    ++pending_blocks_;
  }
}

void FenceQueue::add(std::unique_ptr<Fence> fence, Block* block) {
  track(block);
  entries_.push_back(Entry{std::move(fence), {block}});
}

void FenceQueue::defer_to_epoch(Block* block) {
  track(block);
  epoch_.push_back(block);
  epoch_bytes_ += block->size;
  std::size_t& largest = epoch_largest_[pool_index(block)];
  if (block->size > largest) largest = block->size;
}

void FenceQueue::close_epoch(SegmentBackend& backend) {
  if (epoch_.empty()) return;
  entries_.push_back(Entry{backend.record_device_fence(), std::move(epoch_), true});
  epoch_.clear();
  epoch_bytes_ = 0;
  epoch_largest_[0] = epoch_largest_[1] = 0;
}

void FenceQueue::clear() {
  entries_.clear();
  epoch_.clear();
  epoch_bytes_ = 0;
  epoch_largest_[0] = epoch_largest_[1] = 0;
  pending_bytes_ = 0;
  pool_pending_bytes_[0] = pool_pending_bytes_[1] = 0;
  pending_blocks_ = 0;
}

}  // namespace cudalloc
