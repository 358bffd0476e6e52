// A thread's private stock of free blocks, so that a cached allocate and free touch no shared
// lock. Bins hold blocks reusable at once on their stream, keyed by (stream, rounded request
// size): a block may be larger than the request it served, and serves the same request again.
// Blocks freed with cudaFree wait in `deferred`; the owner closes them into batches behind
// device fences shared across threads (fence_clock.h), and once a batch's fence completes its
// blocks refill the bins. `live` holds the blocks this thread took from its bins and has not
// freed yet, so that a block allocated and freed on one thread touches no line another thread
// writes (threads of cudaMalloc share segments, so a map sharded by address puts their blocks
// side by side). The owner thread takes `lock` uncontended; the device allocator takes it to
// drain the cache under pressure, to read the statistics deltas, and to find a block freed by
// another thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "allocator/block.h"
#include "allocator/live_map.h"
#include "allocator/memory_stats.h"
#include "allocator/spin_lock.h"

namespace cudalloc {

class ThreadCache {
 public:
  static constexpr std::size_t kBins = 32;
  static constexpr std::size_t kDepth = 64;
  // Deferred frees are fenced in batches of this many blocks (or bytes), so the cost of a
  // device fence (an event per stream, then a query: 0.9-1.6 us on the H100 host) is shared. A
  // thread that allocates and frees in a loop has one batch outstanding at a time, so this is
  // also the number of pairs per fence. A batch refills a bin kDepth blocks at a time.
  static constexpr std::size_t kBatchBlocks = 256;
  static constexpr std::size_t kBatchBytes = 16 * kMiB;
  // Past this many closed batches the owner hands the older ones to the device allocator.
  // (Deferred frees never pile up past a batch: one is closed at kBatchBlocks.)
  static constexpr std::size_t kMaxBatches = 8;

  struct Batch {
    std::uint64_t ticket;  // see fence_clock.h
    std::vector<Block*> blocks;
    bool passed = false;  // its fence is known complete: what is left of it needs no query
  };

  Block* pop(StreamHandle stream, std::size_t size) {
    Bin& bin = bins_[index(stream, size)];
    // A bin may hold another key (collision): then this is a miss.
    if (bin.count == 0 || bin.stream != stream || bin.size != size) return nullptr;
    return bin.blocks[--bin.count];
  }

  // False when the bin is full or holds another key.
  bool push(Block* block, std::size_t size) {
    Bin& bin = bins_[index(block->stream, size)];
    if (bin.count != 0 && (bin.stream != block->stream || bin.size != size)) return false;
    if (bin.count == kDepth) return false;
    bin.stream = block->stream;
    bin.size = size;
    bin.blocks[bin.count++] = block;
    block->state = BlockState::kCached;
    return true;
  }

  // Whether the bin of (stream, size) holds that key and has no room.
  bool full(StreamHandle stream, std::size_t size) const {
    const Bin& bin = bins_[index(stream, size)];
    return bin.count == kDepth && bin.stream == stream && bin.size == size;
  }

  template <typename F>
  void drain_bins(F&& f) {
    for (Bin& bin : bins_) {
      while (bin.count != 0) f(bin.blocks[--bin.count]);
    }
  }

  std::vector<Block*>& deferred() { return deferred_; }
  std::size_t& deferred_bytes() { return deferred_bytes_; }
  bool batch_due() const { return deferred_.size() >= kBatchBlocks || deferred_bytes_ >= kBatchBytes; }
  // Closes the deferred frees as one batch, stamped with `ticket`.
  void close_batch(std::uint64_t ticket) {
    batches_.push_back(Batch{ticket, std::move(deferred_)});
    deferred_.clear();
    deferred_bytes_ = 0;
  }
  std::deque<Batch>& batches() { return batches_; }
  // Blocks that became reusable but found no room in the bins: the allocator takes them.
  std::vector<Block*>& spill() { return spill_; }

  // Statistics changes made on the hot path, folded into the allocator's under its lock.
  MemoryStats& delta() { return delta_; }
  std::int64_t hits = 0;
  LiveTable live;

  SpinLock lock;

 private:
  struct Bin {
    StreamHandle stream = 0;
    std::size_t size = 0;
    std::size_t count = 0;
    std::array<Block*, kDepth> blocks{};
  };
  static std::size_t index(StreamHandle stream, std::size_t size) {
    return (((size >> 9) ^ (stream * 0x9E3779B97F4A7C15ull)) * 0xff51afd7ed558ccdull) >> 59;
  }

  std::array<Bin, kBins> bins_;
  std::vector<Block*> deferred_;
  std::size_t deferred_bytes_ = 0;
  std::deque<Batch> batches_;
  std::vector<Block*> spill_;
  MemoryStats delta_;
};

}  // namespace cudalloc
