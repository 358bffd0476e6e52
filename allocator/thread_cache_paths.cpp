// The thread-cache side of the device allocator: DeviceAllocator::allocate and ::free with
// their lock-free hot paths (an exact-size block from, or back to, the calling thread's
// cache), and the plumbing that ties the caches to the allocator: finding this thread's
// cache, folding its statistics in, refilling its bins from fenced batches, and draining it
// back into the pools. Kept in one translation unit so that everything the hot paths call is
// inlinable; whatever misses falls through to the locked ladder in device_allocator.cpp.
#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/allocator_stats.h"
#include "allocator/device_allocator_impl.h"

namespace cudalloc {

namespace {

using Impl = DeviceAllocator::Impl;

// Whether a large block, reusable at once, goes to the freeing thread's bins: only a whole plain
// segment freed by the thread that took it. A whole segment has no neighbours to keep from
// coalescing (parking split blocks cost vit-train's replay 1.1% of utilization: the bins hand
// back the last block freed, where the pool picks the best fit). One freed by a consumer thread
// that never allocates its size would sit in that thread's bins. (The size test reads no links
// that the locked path may be changing.)
bool parks_large(const Block* b, bool taken_here) {
  return taken_here && !b->segment->expandable && b->size == b->segment->size;
}

struct LocalEntry {
  std::uint64_t id;
  std::weak_ptr<Impl> owner;
  std::shared_ptr<ThreadCache> cache;
};
// The entry found last, so that a thread using one allocator finds its cache with one
// comparison: plain thread-locals, read without the guard that t_local's destructor brings.
// Allocator ids are never reused, so an id of a destroyed allocator matches no lookup.
thread_local std::uint64_t t_last_id = 0;
thread_local ThreadCache* t_last_cache = nullptr;

// A thread's caches, one per allocator it used; given back when the thread exits.
struct LocalCaches {
  std::vector<LocalEntry> entries;
  ~LocalCaches() {
    t_last_id = 0;  // whatever runs later on this thread must not find a retired cache
    for (LocalEntry& e : entries) {
      if (auto owner = e.owner.lock()) owner->retire(e.cache);
    }
  }
};

thread_local LocalCaches t_local;

// The hot paths' lookups: the last entry's comparison inline, the rest out of line (a call
// and its register saves cost a cached pair about 25 instructions).
CUDALLOC_INLINE ThreadCache* find_local_fast(Impl& m) {
  if (t_last_id == m.id) [[likely]] return t_last_cache;
  return m.find_local_cache();
}
CUDALLOC_INLINE ThreadCache& local_fast(Impl& m) {
  if (t_last_id == m.id) [[likely]] return *t_last_cache;
  return m.local_cache();
}

}  // namespace

CUDALLOC_HOT ThreadCache* Impl::find_local_cache() {
  if (t_last_id == id) [[likely]] return t_last_cache;
  for (LocalEntry& e : t_local.entries) {
    if (e.id == id) {
      t_last_id = id;
      t_last_cache = e.cache.get();
      return t_last_cache;
    }
  }
  return nullptr;
}

CUDALLOC_HOT ThreadCache& Impl::local_cache() {
  if (ThreadCache* found = find_local_cache()) [[likely]] return *found;
  LocalCaches& local = t_local;
  std::erase_if(local.entries, [](const LocalEntry& e) { return e.owner.expired(); });
  auto cache = std::make_shared<ThreadCache>();
  {
    std::lock_guard lock(mutex);
    caches.push_back(cache);
  }
  local.entries.push_back(LocalEntry{id, weak_from_this(), cache});
  t_last_id = id;
  t_last_cache = cache.get();
  return *cache;
}

void Impl::retire(const std::shared_ptr<ThreadCache>& cache) {
  std::lock_guard lock(mutex);
  drain(*cache, true);
  {
    std::lock_guard cache_lock(cache->lock);
    cache->live.for_each([this](DevicePtr p, Block* b) { live.insert(p, b); });
    cache->live.clear();
  }
  std::erase(caches, cache);
}

// The shared map, then, under the lock, every thread's table: a block freed by a thread other
// than the one that took it from its cache. (free() looks in the caller's own table first.)
CUDALLOC_HOT Block* Impl::take_live_elsewhere(DevicePtr ptr) {
  if (Block* b = live.take(ptr)) return b;
  if (!regions.may_hold(ptr)) return nullptr;  // not ours: no need for the device lock
  std::lock_guard lock(mutex);
  if (Block* b = in_thread_tables([ptr](LiveTable& t) { return t.take(ptr); })) return b;
  // A thread that exited since the first look handed its table to the shared map (retire).
  return live.take(ptr);
}

CUDALLOC_HOT bool Impl::live_here(DevicePtr ptr) {
  if (ThreadCache* own = find_local_cache()) {
    std::lock_guard lock(own->lock);
    if (own->live.get(ptr) != nullptr) return true;
  }
  return live.get(ptr) != nullptr;
}

Block* Impl::find_live_locked(DevicePtr ptr) {
  if (Block* b = live.get(ptr)) return b;
  return in_thread_tables([ptr](LiveTable& t) { return t.get(ptr); });
}

// Folds every thread's hot-path statistics into `stats`. Done before the locked path changes
// them, so that a peak is never taken over totals that miss another thread's frees.
void Impl::merge_deltas() {
  for (auto& cache : caches) {
    std::lock_guard lock(cache->lock);
    cache->fold_into(stats);
  }
}

// Takes a cache's statistics, its deferred frees, its spilled blocks and, with `bins` (memory
// is short), its cached blocks and fenced batches. Without it, a thread keeps its two newest
// batches to refill its bins.
void Impl::drain(ThreadCache& cache, bool bins) {
  std::lock_guard lock(cache.lock);
  cache.fold_into(stats);
  for (Block* b : cache.deferred()) fences.defer_to_epoch(b);
  cache.deferred().clear();
  cache.deferred_bytes() = 0;
  for (Block* b : cache.spill()) blocks.make_reusable(b);
  cache.spill().clear();
  // A batch handed over is reusable at once if its fence has passed; otherwise it joins the
  // open epoch: the fence that closes it comes later than the batch's frees, which is all a
  // batch needs.
  auto& batches = cache.batches();
  while (batches.size() > (bins ? 0 : 2)) {
    // Records nothing here (this runs under the device lock and the cache's): a batch not
    // known past its fence joins the epoch, which loses nothing.
    const bool passed = batches.front().passed || batch_fences.passed_now(batches.front().ticket);
    for (Block* b : batches.front().blocks) {
      if (passed) {
        release_block(b);
      } else {
        fences.defer_to_epoch(b);
      }
    }
    batches.pop_front();
  }
  if (bins) cache.drain_bins([this](Block* b) { blocks.make_reusable(b); });
}

// Moves the blocks of this thread's oldest batch into its bins once a device fence recorded
// after it is done, until the bin that missed (stream, rounded) is full: the rest of the batch
// waits for the next refill, which needs no fence query and visits only what it moves. Blocks
// with no room in their bins are spilled to the allocator. Called by the owner with the cache
// locked, when its bins miss.
CUDALLOC_HOT bool Impl::refill(ThreadCache& cache, StreamHandle stream, std::size_t rounded) {
  auto& batches = cache.batches();
  if (batches.empty()) return false;
  ThreadCache::Batch& batch = batches.front();
  if (!batch.passed && !batch_fences.passed(batch.ticket, backend)) return false;
  batch.passed = true;
  auto& blocks = batch.blocks;
  std::size_t moved = 0;
  for (; moved < blocks.size() && !cache.full(stream, rounded); ++moved) {
    Block* b = blocks[moved];
    cache.delta().inactive(b);
    if (!cache.push(b, sizes.round(b->requested))) {
      b->state = BlockState::kPending;
      cache.spill().push_back(b);
    }
  }
  blocks.erase(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(moved));
  if (blocks.empty()) batches.pop_front();
  return true;
}

void Impl::drain_all(bool bins) {
  for (auto& cache : caches) drain(*cache, bins);
}

void Impl::drain_own() {
  if (ThreadCache* own = find_local_cache()) drain(*own, true);
}

void Impl::drain_own_large() {
  ThreadCache* own = find_local_cache();
  if (own == nullptr) return;
  std::lock_guard lock(own->lock);
  if (own->large_bytes() == 0) return;
  own->drain_large_bins([this](Block* b) { blocks.make_reusable(b); });
}

CUDALLOC_HOT Status DeviceAllocator::allocate(std::size_t bytes, StreamHandle stream, DevicePtr* out, bool async) {
  Impl& m = *impl_;
  if (m.options.thread_cache && bytes != 0 && bytes <= ThreadCache::kLargeBytes) {
    // Hot path: an exact-size block from this thread's cache.
    const std::size_t rounded = m.sizes.round(bytes);
    ThreadCache& cache = local_fast(m);
    Block* b = nullptr;
    bool spilled = false;
    {
      std::lock_guard lock(cache.lock);
      b = cache.pop(stream, rounded);
      // Fenced batches hold small blocks only.
      if (b == nullptr && rounded <= kSmallSize && m.refill(cache, stream, rounded)) b = cache.pop(stream, rounded);
      if (b != nullptr) {
        b->state = BlockState::kAllocated;
        b->requested = bytes;
        cache.delta().alloc(b, m.sizes.is_oversize(b->size));
        ++cache.hits;
        cache.live.insert(b->ptr, b);
      }
      spilled = !cache.spill().empty();
    }
    if (spilled) {
      std::lock_guard lock(m.mutex);
      m.drain(cache, false);
    }
    if (b != nullptr) {
      *out = b->ptr;
      if (m.observer.load(std::memory_order_relaxed) != nullptr) [[unlikely]] {
        m.count_allocated(static_cast<std::int64_t>(b->size));
        m.notify(EventKind::kAlloc, stream, b->ptr, bytes, b->size, Status::kOk, async, true, /*local=*/true);
      }
      return Status::kOk;
    }
  }
  std::lock_guard lock(m.mutex);
  return m.allocate(bytes, stream, out, async);
}

CUDALLOC_HOT Status DeviceAllocator::free(DevicePtr ptr, FreeOrder order, StreamHandle stream, bool async) {
  Impl& m = *impl_;
  // The calling thread's own table first, keeping its lock: a block allocated and freed on one
  // thread goes back to that thread's cache under a single lock, touching no line another
  // thread writes.
  ThreadCache* own = m.options.thread_cache ? find_local_fast(m) : nullptr;
  std::unique_lock<SpinLock> held;
  Block* b = nullptr;
  if (own != nullptr) {
    held = std::unique_lock<SpinLock>(own->lock);
    b = own->live.take(ptr);
    if (b == nullptr) held.unlock();
  }
  const bool found_own = b != nullptr;
  if (b == nullptr) b = m.take_live_elsewhere(ptr);
  if (b == nullptr) return Status::kInvalidValue;  // unknown, interior, or already freed
  // Hot path: a block reusable at once goes to this thread's cache; a cudaFree'd one waits
  // there for the next device fence.
  const bool reusable = order == FreeOrder::kCompleted ||
                        (order == FreeOrder::kStream && stream == b->stream && b->stream_uses.empty());
  const bool cacheable = b->pool == PoolKind::kSmall
                             ? reusable || order == FreeOrder::kDevice
                             : reusable && parks_large(b, found_own || (own != nullptr && b->taker == own));
  if (m.options.thread_cache && cacheable) {
    ThreadCache& cache = own != nullptr ? *own : local_fast(m);
    if (!held.owns_lock()) held = std::unique_lock<SpinLock>(cache.lock);
    const std::size_t size = b->size;
    const std::size_t requested = b->requested;
    // Reported before the block enters the cache, where another thread may drain it (under the
    // cache's lock, held here): an observer must not hear of this free after the block's next
    // life began.
    if (m.observer.load(std::memory_order_relaxed) != nullptr) [[unlikely]] {
      m.count_allocated(-static_cast<std::int64_t>(size));
      m.notify(EventKind::kFree, stream, ptr, requested, size, Status::kOk, async, false, /*local=*/found_own);
    }
    bool cached = false;
    bool hand_over = false;
    std::uint64_t cover_ticket = 0;  // a batch closed here, fenced outside the cache's lock
    const bool oversize = m.sizes.is_oversize(size);
    if (reusable) {
      cache.delta().free_reusable(b, oversize);
      cached = cache.push(b, m.sizes.round(requested));
      if (!cached) b->state = BlockState::kPending;
    } else {
      cache.delta().free(b, oversize);
      b->state = BlockState::kPending;
      b->stream_uses.clear();
      cache.deferred().push_back(b);
      cache.deferred_bytes() += b->size;
      cached = true;
      // A full batch is closed with a ticket and put behind a device fence shared by every
      // batch closed so far (fence_clock.h). Too many outstanding batches go to the
      // allocator instead.
      if (cache.batch_due()) {
        // Covered at once: a loop keeps about one batch outstanding, needed when its bins
        // next run dry, and a fence recorded only then is not yet done. (Covering the batch
        // three back, as before, never fired in a loop: the fence was recorded by the refill
        // that needed it.)
        cover_ticket = m.batch_fences.stamp();
        cache.close_batch(cover_ticket);
      }
      hand_over = cache.batches().size() > ThreadCache::kMaxBatches;
    }
    held.unlock();
    if (cover_ticket != 0) m.batch_fences.cover(cover_ticket, m.backend);
    if (cached && !hand_over) return Status::kOk;
    std::lock_guard lock(m.mutex);
    ++m.stats.num_locked_frees;
    if (!cached) m.blocks.make_reusable(b);  // its bin was full
    if (hand_over) m.drain(cache, false);
    return Status::kOk;
  }
  if (held.owns_lock()) held.unlock();  // the device lock is taken before a cache's, never after
  std::lock_guard lock(m.mutex);
  m.free(b, order, stream, async);
  return Status::kOk;
}

}  // namespace cudalloc
