// Freed blocks that may still be in use by device work queued before their free.
//
// A block freed in stream order onto another stream, or used on extra streams, waits on one
// fence per stream. A block freed with cudaFree waits on a device fence; those frees are
// gathered into an epoch and one device fence covers the whole epoch, so the cost of fencing
// every stream is paid once per batch rather than once per free.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "allocator/backend.h"
#include "allocator/block.h"

namespace cudalloc {

class FenceQueue {
 public:
  // `block` waits on `fence` (in addition to any other fence it already waits on).
  void add(std::unique_ptr<Fence> fence, Block* block);
  // `block` joins the open epoch; it waits for the device fence that closes it.
  void defer_to_epoch(Block* block);
  bool epoch_open() const { return !epoch_.empty(); }
  std::size_t epoch_bytes() const { return epoch_bytes_; }
  // Whether the open epoch holds a block of `pool` of at least `bytes`.
  bool epoch_holds(PoolKind pool, std::size_t bytes) const {
    return epoch_largest_[pool == PoolKind::kLarge ? 1 : 0] >= bytes;
  }
  // Whether the fence of the last epoch closed no longer holds its blocks back (true if none
  // is outstanding). Queries one fence; the others are settled by collect().
  bool newest_epoch_passed() {
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
      if (it->epoch) return reusable_after(*it->fence);
    }
    return true;
  }
  // Puts one device fence behind every block of the open epoch.
  void close_epoch(SegmentBackend& backend);

  // Hands every block whose fences have all completed, or order its reuse, to `ready`.
  // Non-blocking.
  template <typename F>
  std::size_t collect(F&& ready) {
    std::size_t n = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (!reusable_after(*it->fence)) {
        ++it;
        continue;
      }
      n += settle(*it, ready);
      it = entries_.erase(it);
    }
    return n;
  }

  // Closes the epoch, waits for every fence and hands every block to `ready`. Fences that
  // cannot be waited for now stay queued.
  template <typename F>
  std::size_t wait_all(SegmentBackend& backend, F&& ready) {
    close_epoch(backend);
    std::size_t n = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (!it->fence->wait()) {
        ++it;
        continue;
      }
      n += settle(*it, ready);
      it = entries_.erase(it);
    }
    return n;
  }

  // Waits for the oldest fence and hands its blocks to `ready`. False if there is none, or it
  // cannot be waited for now.
  template <typename F>
  bool wait_oldest(F&& ready) {
    if (entries_.empty() || !entries_.front().fence->wait()) return false;
    settle(entries_.front(), ready);
    entries_.pop_front();
    return true;
  }

  // Drops everything without waiting (the context is gone).
  void clear();

  std::size_t pending_bytes() const { return pending_bytes_; }
  std::size_t pending_bytes(PoolKind pool) const { return pool_pending_bytes_[pool == PoolKind::kLarge ? 1 : 0]; }
  std::size_t pending_blocks() const { return pending_blocks_; }

 private:
  struct Entry {
    std::unique_ptr<Fence> fence;
    std::vector<Block*> blocks;
    bool epoch = false;  // a device fence closing an epoch
  };

  template <typename F>
  std::size_t settle(Entry& entry, F& ready) {
    std::size_t n = 0;
    for (Block* b : entry.blocks) {
      if (--b->pending_fences == 0) {
        pending_bytes_ -= b->size;
        pool_pending_bytes_[pool_index(b)] -= b->size;
        --pending_blocks_;
        ready(b);
        ++n;
      }
    }
    return n;
  }
  void track(Block* block);
  static int pool_index(const Block* b) {
    return b->segment != nullptr && b->segment->pool == PoolKind::kLarge ? 1 : 0;
  }

  std::deque<Entry> entries_;
  std::vector<Block*> epoch_;
  std::size_t epoch_bytes_ = 0;
  std::size_t epoch_largest_[2] = {0, 0};  // small, large
  std::size_t pending_bytes_ = 0;
  std::size_t pool_pending_bytes_[2] = {0, 0};  // small, large
  std::size_t pending_blocks_ = 0;
};

}  // namespace cudalloc
