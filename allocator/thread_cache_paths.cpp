// The thread-cache side of the device allocator: DeviceAllocator::allocate and ::free with
// their lock-free hot paths (a block of the request's bin class from, or back to, the calling
// thread's cache), and the plumbing that ties the caches to the allocator: finding this thread's
// cache, folding its statistics in, refilling its bins from fenced batches, and draining it
// back into the pools. Kept in one translation unit so that everything the hot paths call is
// inlinable; whatever misses falls through to the locked ladder in device_allocator.cpp.
#include <algorithm>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "allocator/allocator_stats.h"
#include "allocator/device_allocator_impl.h"

namespace cudalloc {

namespace {

using Impl = DeviceAllocator::Impl;

// Whether a large block, reusable at once, goes to the freeing thread's bins: only a whole plain
// segment freed by the thread that took it. A whole segment has no neighbours to keep from
// coalescing (parking split blocks cost the replays utilization: the bins hand back the last
// block freed, where the pool picks the best fit). One freed by a consumer thread that never
// allocates its size would sit in that thread's bins. (The size test reads no links that the
// locked path may be changing.)
bool parks_large(const Block* b, bool taken_here) {
  return taken_here && !b->segment->expandable && b->size == b->segment->size;
}

// A large block reusable at once that the freeing thread keeps in its bins: a whole segment
// (parks_large), or a split block the thread has freed and got back three times in a row (as
// a cudaFree'd one waits in its batches, free_large_deferred): a loop of one size that the pool
// would split from the same segment each time otherwise took the device lock twice a pair.
// `held` is the thread's cache lock, taken here if needed.
bool parks_cycled_large(Block* b, bool taken_here, ThreadCache* own, std::unique_lock<SpinLock>& held) {
  if (parks_large(b, taken_here)) return true;
  if (!taken_here || b->segment->expandable) return false;
  if (!held.owns_lock()) held = std::unique_lock<SpinLock>(own->lock);
  return own->cycles_large(b->ptr, b->size, ThreadCache::Cycle::kSameBlock);
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
// Set when t_local is destroyed at the thread's exit. Thread-locals constructed before it (an
// empty holder the program fills later) are destroyed after it, and may still allocate or free:
// from then on this thread takes the locked path and must not read t_local, whose vector is gone.
thread_local bool t_caches_gone = false;
// Set when t_local is made, at this thread's first look for a cache: the first use of t_local
// registers its destructor with the C library, which allocates (see
// abandon_thread_caches_after_fork).
thread_local bool t_local_made = false;

// A thread's caches, one per allocator it used; given back when the thread exits.
struct LocalCaches {
  LocalCaches() { t_local_made = true; }
  std::vector<LocalEntry> entries;
  ~LocalCaches() {
    t_last_id = 0;  // whatever runs later on this thread must not find a retired cache
    t_caches_gone = true;
    for (LocalEntry& e : entries) {
      if (auto owner = e.owner.lock()) owner->retire(e.cache);
    }
  }
};

thread_local LocalCaches t_local;

}  // namespace

void DeviceAllocator::abandon_thread_caches_after_fork() {
  t_last_id = 0;
  t_last_cache = nullptr;
  // A thread that never looked for a cache has no t_local: its first use here would make it,
  // and register its destructor with a call to the heap.
  if (!t_local_made) return;
  // Leaked, not destroyed (the caches belong to the abandoned allocators), and with no call to
  // the heap: another parent thread may have held its lock at the fork (ASan's allocator, for
  // one, then never lets the child through).
  new (&t_local.entries) std::vector<LocalEntry>();
}

CUDALLOC_HOT ThreadCache* Impl::find_local_cache() {
  if (t_last_id == id) [[likely]] return t_last_cache;
  if (t_caches_gone) return nullptr;
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
  drain(*cache, Drain::kWithBins);
  {
    std::lock_guard cache_lock(cache->lock);
    cache->live.for_each([this](DevicePtr p, Block* b) { live.insert(p, b); });
    cache->live.clear();
  }
  std::erase(caches, cache);
}

// The shared map, then, under the lock, every thread's table: a block freed by a thread other
// than the one that took it from its cache. (free() looks in the caller's own table first, and
// free_block() has ruled out pointers outside this allocator's regions.)
CUDALLOC_HOT Block* Impl::take_live_elsewhere(DevicePtr ptr) {
  if (Block* b = live.take(ptr)) return b;
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

// Takes a cache's statistics, its deferred frees, its spilled blocks and, kWithBins (memory is
// short), its cached blocks and fenced batches. Otherwise a thread keeps its two newest batches
// to refill its bins.
void Impl::drain(ThreadCache& cache, Drain what) {
  const bool bins = what == Drain::kWithBins;
  std::lock_guard lock(cache.lock);
  stats.fold(cache);
  for (Block* b : cache.deferred()) {
    cache.left_batches(b);
    fences.defer_to_epoch(b);
  }
  cache.clear_deferred();
  return_spill(cache);
  // A batch handed over is reusable at once if its fence has passed; otherwise it joins the
  // open epoch: the fence that closes it comes later than the batch's frees, which is all a
  // batch needs.
  auto& batches = cache.batches();
  while (batches.size() > (bins ? 0 : 2)) {
    // Records nothing here (this runs under the device lock and the cache's): a batch not
    // known past its fence joins the epoch, which loses nothing.
    const bool passed = batches.front().passed || batch_fences.passed_now(batches.front().ticket);
    for (Block* b : batches.front().blocks) {
      cache.left_batches(b);
      if (passed) {
        release_block(b);
      } else {
        fences.defer_to_epoch(b);
      }
    }
    batches.pop_front();
  }
  if (bins) {
    cache.drain_bins([this](Block* b) { blocks.make_reusable(b); });
    cache.reset_bridges();  // the pipeline is gone: a new one may bridge again
  }
}

// Moves the blocks of this thread's oldest batch into its bins once a device fence recorded
// after it is done, until the bin that missed (stream, rounded) is full: the rest of the batch
// waits for the next refill, which needs no fence query and visits only what it moves. Blocks
// with no room in their bins are spilled to the allocator. Called by the owner with the cache
// locked, when its bins miss. With BusyFence::kBridge, a fence that another thread is recording
// is not waited for (kBusy: the caller bridges instead).
CUDALLOC_HOT Impl::Refill Impl::refill(ThreadCache& cache, StreamHandle stream, std::size_t rounded, BusyFence busy) {
  auto& batches = cache.batches();
  if (batches.empty()) return Refill::kNone;
  ThreadCache::Batch& batch = batches.front();
  if (!batch.passed) {
    if (busy == BusyFence::kWait) {
      if (!batch_fences.passed(batch.ticket, backend)) {
        cache.batch_lagged();
        return Refill::kNone;
      }
    } else {
      const FenceClock::Answer answer = batch_fences.try_passed(batch.ticket, backend);
      if (answer == FenceClock::Answer::kBusy) return Refill::kBusy;
      if (answer == FenceClock::Answer::kNotYet) {
        cache.batch_lagged();
        return Refill::kNone;
      }
    }
  }
  if (!batch.passed) batch_fences.catch_up_quiet();
  batch.passed = true;
  auto& blocks = batch.blocks;
  std::size_t bytes = 0;
  std::size_t moved = cache.fill_bin(stream, rounded, blocks.data(), blocks.size(), &bytes);
  if (moved != 0) cache.delta().inactive_small(static_cast<std::int64_t>(moved), static_cast<std::int64_t>(bytes));
  for (; moved < blocks.size() && !cache.full(stream, rounded); ++moved) {
    Block* b = blocks[moved];
    cache.left_batches(b);
    cache.delta().inactive(b);
    if (!cache.push(b)) {
      b->state = BlockState::kPending;
      (void)cache.add_spill(b);
    }
  }
  blocks.erase(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(moved));
  if (blocks.empty()) batches.pop_front();
  return Refill::kDone;
}

void Impl::drain_all(Drain what) {
  for (auto& cache : caches) drain(*cache, what);
}

// A small miss before new memory is cut: the thread's bins, its spill and its batches known
// past their fences go back to the pools; its deferred frees and the batches still waiting stay.
// Handed to the allocator's epoch, they would wait there until it holds free_epoch_mb (or
// memory is short): a loop of blocks of which a segment holds fewer than a batch then never
// closed a batch of its own, and cut new segments under the device lock for every pair until
// the epoch filled.
void Impl::drain_own() {
  ThreadCache* own = find_local_cache();
  if (own == nullptr) return;
  ThreadCache& cache = *own;
  std::lock_guard lock(cache.lock);
  stats.fold(cache);
  return_spill(cache);
  release_passed_batches(cache);
  cache.drain_bins([this](Block* b) { blocks.make_reusable(b); });
  cache.reset_bridges();
}

// Under the cache's lock: its batches known past their fences go back to the pools.
std::size_t Impl::release_passed_batches(ThreadCache& cache) {
  std::size_t released = 0;
  auto& batches = cache.batches();
  while (!batches.empty() && (batches.front().passed || batch_fences.passed_now(batches.front().ticket))) {
    for (Block* b : batches.front().blocks) {
      cache.left_batches(b);
      release_block(b);
    }
    released += batches.front().blocks.size();
    batches.pop_front();
  }
  return released;
}

// A large miss about to cut new memory: every thread's batches past their fences go back to the
// pools first. A thread that cycles a large size keeps its frees in its batches, and a thread
// that frees what another allocates (a producer and a consumer) would otherwise leave the
// consumer to cut new memory while the producer's blocks sit idle.
bool Impl::release_all_passed_batches() {
  std::size_t released = 0;
  for (auto& cache : caches) {
    // A cache whose owner is busy with it is skipped rather than waited for: its owner may be
    // recording or querying a fence under its lock.
    std::unique_lock lock(cache->lock, std::try_to_lock);
    if (!lock.owns_lock() || !cache->holds_large_pending()) continue;
    stats.fold(*cache);
    released += release_passed_batches(*cache);
  }
  return released != 0;
}

void Impl::drain_own_large() {
  ThreadCache* own = find_local_cache();
  if (own == nullptr) return;
  std::lock_guard lock(own->lock);
  return_spill(*own);
  if (own->large_bytes() == 0) return;
  own->drain_large_bins([this](Block* b) { blocks.make_reusable(b); });
}

namespace {

// The block leaves this thread's bins for the program, as a new hand-out with no buffer id yet
// (find() takes one when asked); statistics. Under the cache's lock.
CUDALLOC_INLINE void count_hit(Impl& m, ThreadCache& cache, Block* b, std::size_t bytes) {
  b->taker = &cache;
  b->requested = bytes;
  b->has_buffer_id = false;
  // Last, released: a query under the device lock that finds the block allocated (find) reads
  // the fields above as this hand-out wrote them.
  b->state.store_release(BlockState::kAllocated);
  cache.hit_delta().alloc(b, m.sizes.is_oversize(b->size));
}

// A free reusable at once on its stream: into the bin of its size's class. False when that bin
// has no room (the block is then pending, for the device allocator to take). Under the cache's
// lock.
CUDALLOC_INLINE bool park_reusable(Impl& m, ThreadCache& cache, Block* b) {
  cache.delta().free_reusable(b, m.sizes.is_oversize(b->size));
  if (cache.push(b)) [[likely]] return true;
  b->state = BlockState::kPending;
  return false;
}

// A free reusable at once that the bins do not take: into the spill. Whether the spill is due.
// Under the cache's lock.
CUDALLOC_INLINE bool spill_reusable(Impl& m, ThreadCache& cache, Block* b) {
  cache.delta().free_reusable(b, m.sizes.is_oversize(b->size));
  b->state = BlockState::kPending;
  return m.spill(cache, b);
}

// A cudaFree'd block (small, or a large whole segment), already in the cache's deferred frees,
// waits there for the device fence of its batch. Under the cache's lock.
CUDALLOC_INLINE void count_deferred(Impl& m, ThreadCache& cache, Block* b) {
  cache.delta().free(b, m.sizes.is_oversize(b->size));
  b->state = BlockState::kPending;
  b->stream_uses.clear();
  cache.note_deferred(b);
}

}  // namespace

CUDALLOC_NOINLINE Status Impl::allocate_missed(std::size_t bytes, StreamHandle stream, DevicePtr* out, CallKind call) {
  if (!options.thread_cache || bytes == 0 || bytes > ThreadCache::kLargeBytes || t_caches_gone) {
    return allocate_locked(bytes, stream, out, call);
  }
  const std::size_t rounded = sizes.round(bytes);
  ThreadCache& cache = local_cache();
  Block* b = nullptr;
  bool spilled = false;
  Bridge bridge = Bridge::kNo;
  std::uint64_t wait_for = 0;  // the ticket of the oldest batch, for a thread at its bound
  // Under the cache's lock: a block found is handed out; blocks spilled go to the allocator.
  const auto settle = [&] {
    if (b != nullptr) {
      count_hit(*this, cache, b, bytes);
      cache.live.insert(b->ptr, b);
    }
    spilled = cache.spill_due();
  };
  {
    std::lock_guard lock(cache.lock);
    b = cache.pop(stream, rounded);
    // A block the thread freed moments ago that its bins did not take (a split large one, or a
    // bin was full) still serves it without the device lock.
    if (b == nullptr) b = cache.take_spill(stream, rounded);
    // A small miss: rather than wait while another thread records the fence of its next batch,
    // the thread takes one block from the pools and keeps its cache (a bridge): its pipeline
    // grows by that block, so its batches are needed later, when their fences have had time.
    // Under 8 threads, fences are recorded back to back by one thread at a time, and each
    // thread needs the batch it has just closed. (Draining the cache on such a miss, as a plain
    // small miss does, restarted its pipeline from the pools.)
    if (b == nullptr && rounded <= kSmallSize) {
      const Refill r =
          refill(cache, stream, rounded, cache.may_bridge(rounded) ? BusyFence::kBridge : BusyFence::kWait);
      if (r == Refill::kDone) b = cache.pop(stream, rounded);
      if (r == Refill::kBusy) {
        bridge = Bridge::kYes;
        cache.note_bridge(rounded);
      }
    } else if (b == nullptr && cache.holds_large_pending()) {
      // cudaFree'd large blocks (free_large_deferred) come back the same way. A fence that
      // another thread is recording is waited for (no bridge): what a large miss takes from the
      // pools is mostly new memory. A thread that holds all it may waits for its oldest batch
      // rather than cut more: a program far ahead of the device stays within the bound.
      const Refill r = refill(cache, stream, rounded, BusyFence::kWait);
      if (r == Refill::kDone) {
        b = cache.pop(stream, rounded);
      } else if (const std::size_t bound = ThreadCache::large_hold_bound(options.max_pending_bytes);
                 !cache.batches().empty() && rounded <= bound && !cache.may_defer_large(rounded, bound)) {
        // (A request past the bound could never wait here: waiting would gain it nothing.)
        wait_for = cache.batches().front().ticket;
      }
    }
    settle();
  }
  if (wait_for != 0) {
    // Not under the cache's lock: every locked operation of the other threads folds this
    // cache's statistics under it, and the device may take milliseconds.
    const bool waited = batch_fences.wait_passed(wait_for, backend);
    std::lock_guard lock(cache.lock);
    if (waited) cache.note_pending_wait();
    if (refill(cache, stream, rounded, BusyFence::kWait) == Refill::kDone) b = cache.pop(stream, rounded);
    settle();
  }
  if (spilled) (void)release_spill(cache);
  if (b != nullptr) {
    *out = b->ptr;
    return observed_hit(b, bytes, stream, call);
  }
  return allocate_locked(bytes, stream, out, call, bridge);
}

CUDALLOC_NOINLINE Status Impl::hit_into_table(ThreadCache& cache, Block* b, std::size_t bytes, StreamHandle stream,
                                              DevicePtr* out, CallKind call) {
  cache.live.insert(b->ptr, b);
  cache.lock.unlock();
  *out = b->ptr;
  return observed_hit(b, bytes, stream, call);
}

CUDALLOC_NOINLINE Status Impl::observed_hit(const Block* b, std::size_t bytes, StreamHandle stream, CallKind call) {
  if (AllocatorObserver* o = events.observer()) {
    events.notify_cached(*o,
                         {.kind = EventKind::kAlloc, .stream = stream, .ptr = b->ptr, .requested = bytes,
                          .rounded = b->size, .call = call, .hit = CacheHit::kHit,
                          .locality = Locality::kLocal},
                         static_cast<std::int64_t>(b->size));
  }
  return Status::kOk;
}

// A free the cache takes, reported while the cache's lock is held (see free_block).
CUDALLOC_NOINLINE void Impl::observed_free(const Block* b, StreamHandle stream, Locality locality, CallKind call) {
  if (AllocatorObserver* o = events.observer()) {
    events.notify_cached(*o,
                         {.kind = EventKind::kFree, .stream = stream, .ptr = b->ptr, .requested = b->requested,
                          .rounded = b->size, .call = call, .locality = locality},
                         -static_cast<std::int64_t>(b->size));
  }
}

CUDALLOC_NOINLINE Status Impl::allocate_locked(std::size_t bytes, StreamHandle stream, DevicePtr* out, CallKind call,
                                              Bridge bridge) {
  {
    std::lock_guard lock(mutex);
    release_own_spill();  // the lock is taken anyway: the pools see this thread's spill first
    const bool reclaim = oom.may_reclaim(bytes);
    const Status st = allocate(bytes, stream, out, call, reclaim ? Try::kFirst : Try::kOnly, bridge);
    if (st != Status::kOutOfMemory || !reclaim) return st;
  }
  // Out of memory, not yet reported: memory held elsewhere on the device, given back with no
  // lock of ours held (the other allocators may be reclaiming from this one meanwhile), buys
  // one more try. set_reclaimer comes before the first allocation: the reclaimer is read as is.
  const bool more = oom.reclaim();
  std::lock_guard lock(mutex);
  if (more) return allocate(bytes, stream, out, call, Try::kAgain);
  stats.merge(caches);
  return out_of_memory(bytes, stream, call);
}

// The hot path, a block of the request's class from this thread's bins, makes no call but its
// last: everything else (a miss, a new thread, a size rounded by roundup_power2_divisions or
// past the thread caches' bound, an observer, a second live block) continues out of line.
CUDALLOC_HOT Status DeviceAllocator::allocate(std::size_t bytes, StreamHandle stream, DevicePtr* out, bool async) {
  Impl& m = *impl_;
  const CallKind call = call_kind(async);
  const std::size_t rounded = m.sizes.round_plain(bytes);
  if (rounded - 1 < ThreadCache::kLargeBytes && bytes != 0 && m.options.thread_cache && t_last_id == m.id) [[likely]] {
    ThreadCache& cache = *t_last_cache;
    cache.lock.lock();
    if (Block* b = cache.pop(stream, rounded)) [[likely]] {
      count_hit(m, cache, b, bytes);
      if (!cache.live.insert_newest(b->ptr, b)) [[unlikely]] return m.hit_into_table(cache, b, bytes, stream, out, call);
      cache.lock.unlock();
      *out = b->ptr;
      if (!m.events.observed()) [[likely]] return Status::kOk;
      return m.observed_hit(b, bytes, stream, call);
    }
    cache.lock.unlock();
  }
  return m.allocate_missed(bytes, stream, out, call);
}

// Every free but the hot path's: `own` is the calling thread's cache, or null to look it up.
CUDALLOC_NOINLINE Status Impl::free_block(DevicePtr ptr, FreeOrder order, StreamHandle stream, CallKind call,
                                          ThreadCache* own) {
  // A pointer of the driver's own (its pools, graph memory) or of another device: no table to
  // search. Such frees pass through every allocator of the process in turn.
  if (!regions.may_hold(ptr)) return Status::kInvalidValue;
  if (own == nullptr && options.thread_cache) own = find_local_cache();
  // The calling thread's own table first, keeping its lock.
  std::unique_lock<SpinLock> held;
  Block* b = nullptr;
  if (own != nullptr) {
    held = std::unique_lock<SpinLock>(own->lock);
    b = own->live.take(ptr);
    if (b == nullptr) held.unlock();
  }
  const bool found_own = b != nullptr;
  const Locality locality = found_own ? Locality::kLocal : Locality::kShared;
  if (b == nullptr) b = take_live_elsewhere(ptr);
  if (b == nullptr) return Status::kInvalidValue;  // unknown, interior, or already freed
  const bool taken_here = found_own || (own != nullptr && b->taker == own);
  // No device work queued since a fence that has passed: whatever used the block is done. Only
  // for a block this thread took: one freed by a consumer thread would otherwise sit in that
  // thread's bins, where the thread that allocates its size never finds it.
  if (order == FreeOrder::kDevice && taken_here && batch_fences.quiet()) order = FreeOrder::kCompleted;
  // A block reusable at once goes to this thread's cache; a cudaFree'd small one waits there
  // for the next device fence.
  const bool reusable = order == FreeOrder::kCompleted ||
                        (order == FreeOrder::kStream && stream == b->stream && b->stream_uses.empty());
  const bool small = b->pool == PoolKind::kSmall;
  const bool parks = small || (reusable && parks_cycled_large(b, taken_here, own, held));
  // A large block reusable at once that the bins do not park, freed by the thread that took it,
  // waits in that thread's spill, one device lock for a batch of them: the thread's next locked
  // allocation returns it to the pools before it searches them, so their best fit still sees it.
  const bool cacheable = small ? reusable || order == FreeOrder::kDevice : reusable && (parks || taken_here);
  // (taken_here implies `own`: the taker is a cache, and only its thread finds it.)
  if (order == FreeOrder::kDevice && b->pool == PoolKind::kLarge && taken_here && options.thread_cache &&
      !t_caches_gone) {
    if (held.owns_lock()) held.unlock();
    return free_large_deferred(b, *own, stream, call, locality);
  }
  if (options.thread_cache && cacheable && !t_caches_gone) {
    ThreadCache& cache = own != nullptr ? *own : local_cache();
    if (!held.owns_lock()) held = std::unique_lock<SpinLock>(cache.lock);
    // Reported before the block enters the cache, where another thread may drain it (under the
    // cache's lock, held here): an observer must not hear of this free after the block's next
    // life began.
    if (events.observed()) observed_free(b, stream, locality, call);
    if (reusable) {
      const bool due = parks ? !park_reusable(*this, cache, b) && spill(cache, b) : spill_reusable(*this, cache, b);
      held.unlock();
      return due ? release_spill(cache) : Status::kOk;
    }
    cache.deferred().push_back(b);
    count_deferred(*this, cache, b);
    // Read under the lock: another thread may drain the cache.
    const CloseWhen due = batch_due(cache);
    held.unlock();
    return due != CloseWhen::kNot ? close_batch(cache, due) : Status::kOk;
  }
  if (held.owns_lock()) held.unlock();  // the device lock is taken before a cache's, never after
  std::lock_guard lock(mutex);
  free(b, order, stream, call);
  return Status::kOk;
}

// A cudaFree'd large block taken by this thread (whose cache is `cache`), with no lock held. It
// goes to the allocator's epoch under the device lock, unless another thread holds that lock:
// then, if it is a whole segment, it and the next kLargeDeferRun such frees wait in this
// thread's batches, as small ones do, within kLargeHeldBytes, and the thread's large misses
// refill from them (allocate_missed). Only under contention, so that a program whose frees
// meet an idle lock keeps the epoch's coalescing and early fencing (reach_epoch): the
// --as-cudamalloc replays lost utilization with every such block in the batches. Contended,
// each pair took the lock twice, and threads of large cudaMalloc pairs ran slower together than
// one thread alone.
CUDALLOC_NOINLINE Status Impl::free_large_deferred(Block* b, ThreadCache& cache, StreamHandle stream, CallKind call,
                                                   Locality locality) {
  // A thread that cycles a large size keeps its frees of it in its batches (within
  // kLargeHeldBytes), and its next allocation of that size refills from them without the device
  // lock, one fence serving a batch of them. Otherwise each pair took the lock twice, and a
  // block that the pool would split for the next request closed the epoch, a fence per pair
  // (reach_epoch). Other large frees keep the epoch's coalescing and best fit.
  const bool whole_segment = parks_large(b, true);
  bool cycles = false;
  {
    std::lock_guard lock(cache.lock);
    cycles = cache.cycles_large(b->ptr, b->size, whole_segment ? ThreadCache::Cycle::kSameSize
                                                               : ThreadCache::Cycle::kSameBlock);
  }
  if (cache.in_large_defer_run()) {
    cache.step_large_defer_run();
  } else if (!cycles) {
    if (mutex.try_lock()) {
      std::lock_guard lock(mutex, std::adopt_lock);
      free(b, FreeOrder::kDevice, stream, call);
      return Status::kOk;
    }
    cache.start_large_defer_run();
  }
  std::unique_lock<SpinLock> held(cache.lock);
  // A split block of a size the thread cycles waits too: it comes back to this thread's large
  // bins (refill), and to the pools when its next large miss drains them.
  const bool whole = whole_segment || (cycles && !b->segment->expandable);
  if (!whole || !cache.may_defer_large(b->size, ThreadCache::large_hold_bound(options.max_pending_bytes))) {
    // Past the bound, what waits unfenced is fenced now: no later large free of this thread
    // closes its batch while the bound holds.
    const bool fence_waiting = whole && cache.holds_large_deferred();
    held.unlock();
    if (fence_waiting) (void)close_batch(cache, CloseWhen::kNow);
    std::lock_guard lock(mutex);
    free(b, FreeOrder::kDevice, stream, call);
    return Status::kOk;
  }
  if (events.observed()) observed_free(b, stream, locality, call);
  cache.deferred().push_back(b);
  count_deferred(*this, cache, b);
  const CloseWhen due = batch_due(cache);
  held.unlock();
  return due != CloseWhen::kNot ? close_batch(cache, due) : Status::kOk;
}

// A block reusable at once whose bin had no room, under the cache's lock: it waits in the
// spill. True when the spill is due to go to the allocator (release_spill, once unlocked).
bool Impl::spill(ThreadCache& cache, Block* b) { return cache.add_spill(b); }

// Under the device lock: the calling thread's spilled blocks go back to the pools.
void Impl::release_own_spill() {
  ThreadCache* own = options.thread_cache && !t_caches_gone ? find_local_cache() : nullptr;
  if (own == nullptr) return;
  std::lock_guard cache_lock(own->lock);
  return_spill(*own);
}

// Under the device lock and the cache's: its spilled blocks go back to the pools.
void Impl::return_spill(ThreadCache& cache) {
  for (Block* b : cache.spill()) blocks.make_reusable(b);
  cache.clear_spill();
}

// The thread's spilled blocks go back to the pools, under one device lock.
CUDALLOC_NOINLINE Status Impl::release_spill(ThreadCache& cache) {
  std::lock_guard lock(mutex);
  ++stats.totals.num_locked_frees;
  std::lock_guard cache_lock(cache.lock);
  return_spill(cache);
  return Status::kOk;
}

// Under the cache's lock: whether its deferred frees make a batch now. With a submission
// watch, the allocator's very first cudaFree closes one at once: its fence, once passed, is
// what lets every later free with no work queued since reuse its block at once
// (submission_watch.h), where a first batch of kFirstBatchBlocks left the first pairs to cut a
// block each under the device lock.
Impl::CloseWhen Impl::batch_due(ThreadCache& cache) {
  if (cache.batch_due(options.free_epoch_bytes)) return CloseWhen::kDue;
  return batch_fences.watched() && !batch_fences.recorded_any() ? CloseWhen::kNow : CloseWhen::kNot;
}

// The owner's deferred frees fill a batch. It is closed with a ticket and put behind a device
// fence shared by every batch closed so far (fence_clock.h), at once: a loop keeps about one
// batch outstanding, needed when its bins next run dry, and a fence recorded only then is not
// yet done. Too many outstanding batches go to the allocator instead.
CUDALLOC_NOINLINE Status Impl::close_batch(ThreadCache& cache, CloseWhen when) {
  std::uint64_t ticket = 0;
  bool hand_over = false;
  {
    std::lock_guard lock(cache.lock);
    // Another thread's drain may have taken the deferred frees since they were counted.
    if (when == CloseWhen::kNow ? !cache.deferred().empty() : cache.batch_due(options.free_epoch_bytes)) {
      ticket = batch_fences.stamp();
      cache.close_batch(ticket);
    }
    hand_over = cache.batches_overflow();
  }
  if (ticket != 0) batch_fences.cover(ticket, backend);
  if (!hand_over) return Status::kOk;
  std::lock_guard lock(mutex);
  ++stats.totals.num_locked_frees;
  drain(cache, Drain::kPending);
  return Status::kOk;
}

// The hot path: a block freed by the thread that took it, the newest it took, either in its own
// stream's order (reusable at once: a small block, or a large one that is a whole segment) or,
// small, by cudaFree (waiting in the cache for a batch's fence). It makes no call but its last,
// like allocate's, unless an observer (the trace) is to hear of the free: it does so under the
// cache's lock, held here, before the block can serve again.
CUDALLOC_HOT Status DeviceAllocator::free(DevicePtr ptr, FreeOrder order, StreamHandle stream, bool async) {
  Impl& m = *impl_;
  if (!m.options.thread_cache || t_last_id != m.id) [[unlikely]] {
    return m.free_block(ptr, order, stream, call_kind(async), nullptr);
  }
  ThreadCache& cache = *t_last_cache;
  cache.lock.lock();
  Block* b = cache.live.take_newest(ptr);
  if (b != nullptr) [[likely]] {
    const bool small = b->pool == PoolKind::kSmall;
    if (order == FreeOrder::kDevice && m.batch_fences.quiet()) order = FreeOrder::kCompleted;
    const bool reusable = order == FreeOrder::kCompleted ||
                          (order == FreeOrder::kStream && stream == b->stream && b->stream_uses.empty());
    if (reusable && (small || parks_large(b, true))) {
      if (m.events.observed()) [[unlikely]] m.observed_free(b, stream, Locality::kLocal, call_kind(async));
      const bool due = !park_reusable(m, cache, b) && m.spill(cache, b);
      cache.lock.unlock();
      return due ? m.release_spill(cache) : Status::kOk;
    } else if (order == FreeOrder::kDevice && small && cache.defer_in_place(b)) {
      if (m.events.observed()) [[unlikely]] m.observed_free(b, stream, Locality::kLocal, call_kind(async));
      count_deferred(m, cache, b);
      const Impl::CloseWhen due = m.batch_due(cache);
      cache.lock.unlock();
      return due != Impl::CloseWhen::kNot ? m.close_batch(cache, due) : Status::kOk;
    }
  }
  // Not the hot path's: the block goes back to the newest slot, where free_block looks first.
  if (b != nullptr) cache.live.insert_newest(ptr, b);
  cache.lock.unlock();
  return m.free_block(ptr, order, stream, call_kind(async), &cache);
}

}  // namespace cudalloc
