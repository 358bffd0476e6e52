// A thread's private stock of free blocks, so that a cached allocate and free touch no shared
// lock. Bins hold blocks reusable at once on their stream, keyed by (stream, bin class): a block
// waits in the class of its size (bin_classes.h) and serves a request of its own size, or one up
// to a class's width smaller, so that sizes that vary from call to call find cached blocks too.
// Blocks freed with cudaFree wait in `deferred`; the owner closes them into batches behind
// device fences shared across threads (fence_clock.h), and once a batch's fence completes its
// blocks refill the bins. `live` holds the blocks this thread took from its bins and has not
// freed yet, so that a block allocated and freed on one thread touches no line another thread
// writes (threads of cudaMalloc share segments, so a map sharded by address puts their blocks
// side by side). The owner thread takes `lock` uncontended; the device allocator takes it to
// drain the cache under pressure, to read the statistics deltas, and to find a block freed by
// another thread.
//
// What the bins hold is bounded in bytes, small and large blocks apart (kSmallBytes,
// kLargeBytes), and goes back to the pools before the thread's next miss cuts new memory. A
// cudaFree'd large block waits on the allocator's fences, unless another thread holds the
// device lock: a whole segment the thread took itself then waits in its batches as small ones
// do, up to kLargeHeldBytes a thread (Impl::free_large_deferred).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "allocator/bin_classes.h"
#include "allocator/block.h"
#include "allocator/hot_stats.h"
#include "allocator/live_map.h"
#include "allocator/memory_stats.h"
#include "allocator/size_classes.h"
#include "allocator/spin_lock.h"

namespace cudalloc {

class ThreadCache {
 public:
  // A bin holds at most this many blocks of a small class, kLargeDepth of a large one.
  static constexpr std::size_t kDepth = 64;
  static constexpr std::size_t kLargeDepth = 8;
  // Streams whose blocks the bins hold at once; a fifth finds no bin until one shelf is empty.
  static constexpr std::size_t kShelves = 4;
  // A request looks this deep into a bin for a block of its exact size before it takes the
  // first that fits: sizes that repeat keep their own blocks.
  static constexpr std::size_t kScan = 4;
  // At most this much small memory in a thread's bins.
  static constexpr std::size_t kSmallBytes = 64 * kMiB;
  // Deferred frees are fenced in batches of at most this many blocks (or bytes), so the cost of
  // a device fence (events on the legacy stream and on each busy one, then a query: microseconds
  // of driver calls) is shared. A thread that allocates and frees in a loop has one batch
  // outstanding at a time, so this is also the number of pairs per fence. A batch refills a bin
  // kDepth blocks at a time. A thread's batches start smaller (batch_due) and grow to these.
  static constexpr std::size_t kBatchBlocks = 256;
  static constexpr std::size_t kBatchBytes = 16 * kMiB;
  // A thread's first batches close at these, half a small segment's bytes, so that the first
  // closes before the segment it is cut from runs out; they double after kGrowAfter batches
  // closed at a size, up to kBatchBlocks and kBatchBytes.
  static constexpr std::size_t kFirstBatchBlocks = 32;
  static constexpr std::size_t kFirstBatchBytes = kSmallBuffer / 2;
  static constexpr std::size_t kGrowAfter = 8;
  // Past this many full batches' worth of blocks (or small blocks' bytes) in closed batches the
  // owner hands the older ones to the device allocator. (Deferred frees never pile up past a
  // batch: one is closed at kBatchBlocks.)
  static constexpr std::size_t kMaxBatches = 8;
  // At most this much large memory parked per thread; a 256 MiB buffer still fits.
  static constexpr std::size_t kLargeBytes = 256 * kMiB;
  // A thread holds at most this much of cudaFree'd large blocks deferred or in batches: a loop
  // needs a few batches in flight, since the one just closed is seldom past its fence by the
  // next allocation. (They close a batch at free_epoch_mb, as the allocator's epoch does, or
  // at a quarter of this: batch_due.) Every block held here is one the thread would otherwise
  // free and take back under the device lock, each time behind a fence of its own.
  static constexpr std::size_t kLargeHeldBytes = 4 * kLargeBytes;
  // Once a cudaFree'd large block finds the device lock taken, the thread's next this many such
  // frees skip the lock too, so that under contention it keeps a pipeline of them (its large
  // misses refill from it) rather than send every other one through the lock (deferring only
  // the frees that met the lock taken left most pairs on the lock, and was no faster).
  static constexpr std::uint32_t kLargeDeferRun = 32;

  struct Batch {
    std::uint64_t ticket;  // see fence_clock.h
    std::vector<Block*> blocks;
    bool passed = false;  // its fence is known complete: what is left of it needs no query
  };

  // A block for the rounded request `size` on `stream`: one of its class, of exactly its size
  // if one is near the top of the bin, else the first that fits within bin_classes::slack; or
  // else one of the next kReach classes within that slack, the nearest first. Past kSmallSize
  // the block is from the large pool.
  CUDALLOC_INLINE Block* pop(StreamHandle stream, std::size_t size) {
    Shelf* shelf = shelf_of(stream);
    if (shelf == nullptr) return nullptr;
    const PoolKind pool = SizeClasses::pool_for(size);
    const std::size_t c = bin_classes::of(size, pool);
    Bin& bin = shelf->bins[c];
    Block* b = bin.head;
    if (b != nullptr && b->size == size) [[likely]] {  // a loop of one size: its own block on top
      bin.head = b->cached_next;
      --bin.count;
    } else {
      b = pop_near(*shelf, c, size);
      if (b == nullptr) return nullptr;
    }
    --shelf->count;
    bytes_of(pool) -= b->size;
    return b;
  }

  // False when the block's bin is full, its pool's bytes bound is reached, or every shelf holds
  // another stream's blocks.
  CUDALLOC_INLINE bool push(Block* block) {
    Shelf* shelf = shelf_for(block->stream);
    if (shelf == nullptr) return false;
    std::size_t& bytes = bytes_of(block->pool);
    if (bytes + block->size > bytes_bound(block->pool)) return false;
    Bin& bin = shelf->bins[bin_classes::of(block->size, block->pool)];
    if (bin.count == depth(block->pool)) return false;
    link(*shelf, bin, block);
    bytes += block->size;
    return true;
  }

  // Moves the leading blocks of `from` (small, on `stream`, of the class of the rounded request
  // `size`) into that bin while it has room, and stops at the first block of another class: a
  // refill's common case, a batch of one loop's frees, without a bin lookup per block. Returns
  // how many moved; `bytes` gets the sum of their sizes.
  std::size_t fill_bin(StreamHandle stream, std::size_t size, Block* const* from, std::size_t n, std::size_t* bytes) {
    *bytes = 0;
    if (size > kSmallSize) return 0;
    Shelf* shelf = shelf_for(stream);
    if (shelf == nullptr) return 0;
    const std::size_t c = bin_classes::of(size, PoolKind::kSmall);
    Bin& bin = shelf->bins[c];
    std::size_t moved = 0;
    std::size_t sum = 0;
    for (; moved < n && bin.count < kDepth; ++moved) {
      Block* b = from[moved];
      if (b->stream != stream || b->pool != PoolKind::kSmall || bin_classes::of(b->size, PoolKind::kSmall) != c ||
          small_bytes_ + sum + b->size > kSmallBytes) {
        break;
      }
      sum += b->size;
      link(*shelf, bin, b);
    }
    small_bytes_ += sum;
    *bytes = sum;
    return moved;
  }

  // Whether the bin of the rounded request `size` on `stream` has no room.
  bool full(StreamHandle stream, std::size_t size) const {
    const PoolKind pool = SizeClasses::pool_for(size);
    if (bytes_of(pool) + size > bytes_bound(pool)) return true;
    const Shelf* shelf = shelf_of(stream);
    return shelf != nullptr && shelf->bins[bin_classes::of(size, pool)].count == depth(pool);
  }

  template <typename F>
  void drain_bins(F&& f) {
    drain_classes(0, bin_classes::kClasses, f);
    small_bytes_ = 0;
    large_bytes_ = 0;
  }
  template <typename F>
  void drain_large_bins(F&& f) {
    drain_classes(bin_classes::kSmallClasses, bin_classes::kClasses, f);
    large_bytes_ = 0;
  }
  std::size_t large_bytes() const { return large_bytes_; }

  std::vector<Block*>& deferred() { return deferred_; }
  // deferred().push_back() without a call: false, with nothing done, when it would grow.
  bool defer_in_place(Block* b) {
    if (deferred_.size() == deferred_.capacity()) return false;
    deferred_.push_back(b);
    return true;
  }
  // A cudaFree'd block entered deferred(): counted toward closing a batch (and, large, toward
  // kLargeHeldBytes until it leaves the batches: left_batches()).
  void note_deferred(const Block* b) {
    if (b->pool == PoolKind::kLarge) {
      deferred_large_bytes_ += b->size;
      held_large_bytes_ += b->size;
    } else {
      deferred_bytes_ += b->size;
    }
  }
  // Whether a cudaFree'd large block of `size` may wait here.
  // `bound`: kLargeHeldBytes, or less where max_pending_mb is less (large_hold_bound).
  bool may_defer_large(std::size_t size, std::size_t bound = kLargeHeldBytes) const {
    return held_large_bytes_ + size <= bound;
  }
  static std::size_t large_hold_bound(std::size_t max_pending_bytes) {
    return max_pending_bytes == 0 ? kLargeHeldBytes : std::min(kLargeHeldBytes, max_pending_bytes);
  }
  bool holds_large_pending() const { return held_large_bytes_ != 0; }
  bool holds_large_deferred() const { return deferred_large_bytes_ != 0; }
  // The run of large frees that skip the device lock (kLargeDeferRun). Owner thread only.
  bool in_large_defer_run() const { return large_defer_run_ != 0; }
  void start_large_defer_run() { large_defer_run_ = kLargeDeferRun; }
  void step_large_defer_run() {
    if (large_defer_run_ != 0) --large_defer_run_;
  }
  // A block leaves deferred() or a batch other than by forget_pending().
  void left_batches(const Block* b) {
    if (b->pool == PoolKind::kLarge) held_large_bytes_ -= b->size;
  }
  // After every block of deferred() left it (left_batches).
  void clear_deferred() {
    deferred_.clear();
    deferred_bytes_ = 0;
    deferred_large_bytes_ = 0;
  }
  // The deferred frees and batches dropped with their context.
  void forget_pending() {
    clear_deferred();
    batches_.clear();
    held_large_bytes_ = 0;
  }
  // `large_bytes`: the deferred large blocks' bound (free_epoch_mb), at most a quarter of
  // kLargeHeldBytes so that several batches fit under it: a bound past it would leave them
  // unfenced, with no batch to refill from.
  bool batch_due(std::size_t large_bytes) const {
    return deferred_.size() >= batch_blocks_ || deferred_bytes_ >= batch_bytes_ ||
           (deferred_large_bytes_ != 0 && deferred_large_bytes_ >= std::min(large_bytes, kLargeHeldBytes / 4));
  }
  // Closes the deferred frees as one batch, stamped with `ticket`.
  void close_batch(std::uint64_t ticket) {
    if (++closed_at_size_ >= kGrowAfter) grow_batches();
    batches_.push_back(Batch{ticket, std::move(deferred_)});
    deferred_ = {};
    deferred_.reserve(kBatchBlocks);  // the hot path defers only in place (defer_in_place)
    deferred_bytes_ = 0;
    deferred_large_bytes_ = 0;
  }
  std::deque<Batch>& batches() { return batches_; }
  // Whether the closed batches hold more than kMaxBatches full batches' worth of blocks, or of
  // small blocks' bytes (large ones have their own bound, kLargeHeldBytes).
  bool batches_overflow() const {
    std::size_t n = 0;
    std::size_t small_bytes = 0;
    for (const Batch& batch : batches_) {
      n += batch.blocks.size();
      for (const Block* b : batch.blocks) {
        if (b->pool == PoolKind::kSmall) small_bytes += b->size;
      }
    }
    return n > kMaxBatches * kBatchBlocks || small_bytes > kMaxBatches * kBatchBytes;
  }
  // Each block of a batch is one the thread first took from the pools (its batches are in
  // flight while the next one fills), so a thread's first batches are small: a short loop or a
  // short-lived thread cycles after a few dozen pairs, on memory it cut itself, instead of
  // cutting a whole batch's worth of new segments first. A thread that keeps cycling earns
  // larger batches, and fewer fences per pair; so does one whose oldest batch is found short
  // of its fence (batch_lagged): fences then need more time than a batch gives them.
  void batch_lagged() { grow_batches(); }
  // Whether this cudaFree'd large block (of `size` bytes at `ptr`) is one of a size the thread
  // cycles (a workspace, a staging buffer), whose frees wait in its batches
  // (Impl::free_large_deferred). kSameSize: the thread freed that size last (a whole segment,
  // which no neighbour could coalesce with). kSameBlock, for a block split from a larger
  // segment: the thread freed this very block at least twice in a row before (it got it back
  // each time), and it cycles the size until it frees another large size. Holding split blocks
  // of every repeated size kept them from coalescing, and replays of training steps as
  // cudaMalloc/cudaFree used their memory worse. Owner thread only.
  enum class Cycle : bool { kSameSize, kSameBlock };
  bool cycles_large(DevicePtr ptr, std::size_t size, Cycle rule) {
    if (size != last_large_free_) {
      cycling_large_ = false;
      same_block_frees_ = 0;
    } else if (ptr == last_large_ptr_) {
      ++same_block_frees_;
    }
    const bool same_size = size == last_large_free_;
    last_large_free_ = size;
    last_large_ptr_ = ptr;
    if (same_block_frees_ >= 2) cycling_large_ = true;
    return rule == Cycle::kSameSize ? same_size : cycling_large_;
  }
  // What the thread holds out of the pools: blocks in its bins, deferred and in batches.
  // Under the lock; walks what it counts (for the statistics, not the hot path).
  std::size_t held_bytes() const {
    std::size_t sum = small_bytes_ + large_bytes_;
    for (const Block* b : deferred_) sum += b->size;
    for (const Batch& batch : batches_) {
      for (const Block* b : batch.blocks) sum += b->size;
    }
    sum += spill_bytes_;
    return sum;
  }
  // Blocks that became reusable but found no room in the bins, and large ones the bins do not
  // park: the allocator takes them, a batch of kSpillBatch (or kSpillBytes) at a time, one
  // device lock for them all, or at the thread's next miss that takes the lock, before the
  // pools are searched. (In a random mix of sizes most frees find no room, or are of split
  // large blocks: each took the device lock.)
  static constexpr std::size_t kSpillBatch = 32;
  static constexpr std::size_t kSpillBytes = 64 * kMiB;
  const std::vector<Block*>& spill() const { return spill_; }
  // Adds a block; whether the spill is due to go to the allocator.
  bool add_spill(Block* b) {
    spill_.push_back(b);
    spill_bytes_ += b->size;
    return spill_due();
  }
  bool spill_due() const { return spill_.size() >= kSpillBatch || spill_bytes_ >= kSpillBytes; }
  // The spilled block of `stream` and of the pool of the rounded request `size` that fits it
  // most closely within bin_classes::slack, taken out of the spill; null if none.
  Block* take_spill(StreamHandle stream, std::size_t size) {
    const PoolKind pool = SizeClasses::pool_for(size);
    const std::size_t limit = bin_classes::largest_for(size);
    std::size_t best = spill_.size();
    for (std::size_t i = 0; i < spill_.size(); ++i) {
      const Block* b = spill_[i];
      if (b->stream == stream && b->pool == pool && b->size >= size && b->size <= limit &&
          (best == spill_.size() || b->size < spill_[best]->size)) {
        best = i;
      }
    }
    if (best == spill_.size()) return nullptr;
    Block* b = spill_[best];
    spill_[best] = spill_.back();
    spill_.pop_back();
    spill_bytes_ -= b->size;
    return b;
  }
  void clear_spill() {
    spill_.clear();
    spill_bytes_ = 0;
  }

  // Statistics changes made on the hot path, folded into the allocator's under its lock
  // (fold_into). Every locked operation folds every thread's delta, skipping a cache whose delta
  // has not changed since its last fold without taking its lock (changed()): threads that only
  // meet the locked path (cudaFree'd large blocks) otherwise took each other's cache locks on
  // every operation, a cache-line miss per thread and operation (threads of large cudaFree pairs
  // then ran slower together than one thread alone).
  HotStats& delta() {
    mark_changed();
    return delta_;
  }
  // delta() for an allocation served from the bins, counted as a cache hit too.
  HotStats& hit_delta() {
    ++hits_;
    return delta();
  }
  // Whether the delta may hold changes not folded yet. Read without the cache's lock: a change
  // made by an operation still under way (or one the reading core has not seen yet, nanoseconds
  // after it) is folded at the next fold, so a peak taken meanwhile may count it a little late.
  bool changed() const { return changed_.load(std::memory_order_acquire); }
  // A miss that waited for this thread's oldest batch (num_pending_waits).
  void note_pending_wait() {
    mark_changed();
    ++pending_waits_;
  }
  void fold_into(MemoryStats& totals) {
    changed_.store(false, std::memory_order_relaxed);
    totals.num_pending_waits += pending_waits_;
    pending_waits_ = 0;
    if (delta_.empty() && hits_ == 0) return;
    delta_.fold_into(totals);
    totals.num_cache_hits += hits_;
    hits_ = 0;
  }
  void reset_delta() {
    changed_.store(false, std::memory_order_relaxed);
    delta_ = HotStats{};
    hits_ = 0;
    pending_waits_ = 0;
  }
  // Blocks this thread took from the pools while another thread was recording the fence of
  // its next batch (allocate_missed's bridge), and their bytes: each deepens its pipeline
  // by one block, so that its batches are needed later, when their fences have had time. At
  // most a batch's worth (kBatchBlocks, kBatchBytes) until the pipeline is emptied (a full
  // drain, or the context's end), which resets them.
  bool may_bridge(std::size_t rounded) const {
    return bridged_ < kBatchBlocks && bridged_bytes_ + rounded <= kBatchBytes;
  }
  void note_bridge(std::size_t rounded) {
    ++bridged_;
    bridged_bytes_ += rounded;
  }
  void reset_bridges() {
    bridged_ = 0;
    bridged_bytes_ = 0;
  }
  LiveTable live;

  SpinLock lock;

 private:
  // A class's cached blocks, linked through Block::cached_next, newest first.
  struct Bin {
    Block* head = nullptr;
    std::size_t count = 0;
  };
  struct Shelf {
    StreamHandle stream = 0;
    std::size_t count = 0;  // blocks in all its bins; an empty shelf may take another stream
    std::array<Bin, bin_classes::kClasses> bins{};
  };
  const Shelf* shelf_of(StreamHandle stream) const {
    for (const Shelf& shelf : shelves_) {
      if (shelf.stream == stream && shelf.count != 0) return &shelf;
    }
    return nullptr;
  }
  Shelf* shelf_of(StreamHandle stream) { return const_cast<Shelf*>(std::as_const(*this).shelf_of(stream)); }
  // Per pool: what its bins hold, in bytes; the most they may hold; the most blocks of a class.
  std::size_t& bytes_of(PoolKind pool) { return pool == PoolKind::kSmall ? small_bytes_ : large_bytes_; }
  std::size_t bytes_of(PoolKind pool) const { return pool == PoolKind::kSmall ? small_bytes_ : large_bytes_; }
  static constexpr std::size_t bytes_bound(PoolKind pool) { return pool == PoolKind::kSmall ? kSmallBytes : kLargeBytes; }
  static constexpr std::size_t depth(PoolKind pool) { return pool == PoolKind::kSmall ? kDepth : kLargeDepth; }
  Shelf* shelf_for(StreamHandle stream) {
    if (Shelf* shelf = shelf_of(stream)) return shelf;
    for (Shelf& shelf : shelves_) {
      if (shelf.count == 0) {
        shelf.stream = stream;
        return &shelf;
      }
    }
    return nullptr;
  }
  // pop() past the top of its class's bin.
  static Block* pop_near(Shelf& shelf, std::size_t c, std::size_t size) {
    const std::size_t limit = bin_classes::largest_for(size);
    Block* b = take_fit(shelf.bins[c], size, limit);
    for (std::size_t n = c, i = 0; b == nullptr && i < bin_classes::kReach; ++i) {
      n = bin_classes::next(n);
      if (n == bin_classes::kClasses) return nullptr;
      if (shelf.bins[n].head != nullptr) b = take_fit(shelf.bins[n], size, limit);
    }
    return b;
  }
  static void link(Shelf& shelf, Bin& bin, Block* b) {
    b->cached_next = bin.head;
    b->state = BlockState::kCached;
    bin.head = b;
    ++bin.count;
    ++shelf.count;
  }
  // Unlinks and returns a block of [size, limit] from the first kScan of `bin`: the first of
  // exactly `size`, else the first that fits.
  static Block* take_fit(Bin& bin, std::size_t size, std::size_t limit) {
    Block** fit = nullptr;
    Block** at = &bin.head;
    for (std::size_t i = 0; i < kScan && *at != nullptr; ++i, at = &(*at)->cached_next) {
      const std::size_t s = (*at)->size;
      if (s == size) {
        fit = at;
        break;
      }
      if (fit == nullptr && s > size && s <= limit) fit = at;
    }
    if (fit == nullptr) return nullptr;
    Block* b = *fit;
    *fit = b->cached_next;
    --bin.count;
    return b;
  }
  template <typename F>
  void drain_classes(std::size_t from, std::size_t to, F&& f) {
    for (Shelf& shelf : shelves_) {
      for (std::size_t c = from; c < to; ++c) {
        Bin& bin = shelf.bins[c];
        while (Block* b = bin.head) {
          bin.head = b->cached_next;
          --shelf.count;
          f(b);
        }
        bin.count = 0;
      }
    }
  }

  std::array<Shelf, kShelves> shelves_{};
  std::size_t small_bytes_ = 0;
  std::size_t large_bytes_ = 0;
  std::vector<Block*> deferred_;
  std::size_t deferred_bytes_ = 0;        // small blocks'
  std::size_t deferred_large_bytes_ = 0;  // large blocks'
  std::size_t held_large_bytes_ = 0;      // large blocks' in deferred_ and batches_
  std::uint32_t large_defer_run_ = 0;
  void grow_batches() {
    batch_blocks_ = std::min(batch_blocks_ * 2, kBatchBlocks);
    batch_bytes_ = std::min(batch_bytes_ * 2, kBatchBytes);
    closed_at_size_ = 0;
  }
  std::size_t batch_blocks_ = kFirstBatchBlocks;
  std::size_t batch_bytes_ = kFirstBatchBytes;
  std::size_t closed_at_size_ = 0;
  std::size_t last_large_free_ = 0;
  DevicePtr last_large_ptr_ = 0;
  std::uint32_t same_block_frees_ = 0;
  bool cycling_large_ = false;
  std::deque<Batch> batches_;
  std::vector<Block*> spill_;
  std::size_t spill_bytes_ = 0;
  // Under the lock; the load first keeps a hot path that changes the delta every operation from
  // writing this line every time.
  void mark_changed() {
    if (!changed_.load(std::memory_order_relaxed)) changed_.store(true, std::memory_order_release);
  }
  HotStats delta_;
  std::int64_t hits_ = 0;
  std::int64_t pending_waits_ = 0;
  std::size_t bridged_ = 0;  // see may_bridge
  std::size_t bridged_bytes_ = 0;
  // Last, and aligned, so on a line of its own: other threads read it on every locked
  // operation, its owner writes it once per fold.
  alignas(64) std::atomic<bool> changed_{false};
};

}  // namespace cudalloc
