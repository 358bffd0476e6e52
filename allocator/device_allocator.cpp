#include "allocator/device_allocator.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "allocator/block_pool.h"
#include "allocator/fence_clock.h"
#include "allocator/live_map.h"
#include "allocator/segment_table.h"
#include "allocator/size_classes.h"
#include "allocator/stream_fence.h"
#include "allocator/thread_cache.h"

namespace cudalloc {

namespace {

std::atomic<std::uint64_t> next_allocator_id{1};

// Statistics of one block changing hands; shared by the hot and the locked paths.
void add_stat(StatArray& a, PoolKind k, std::int64_t n) {
  a[kStatAll].increase(n);
  a[stat_index(k)].increase(n);
}
void sub_stat(StatArray& a, PoolKind k, std::int64_t n) {
  a[kStatAll].decrease(n);
  a[stat_index(k)].decrease(n);
}
void account_alloc(MemoryStats& s, const Block* b, bool oversize) {
  const PoolKind k = b->segment->pool;
  const auto size = static_cast<std::int64_t>(b->size);
  add_stat(s.allocation, k, 1);
  add_stat(s.active, k, 1);
  add_stat(s.allocated_bytes, k, size);
  add_stat(s.active_bytes, k, size);
  add_stat(s.requested_bytes, k, static_cast<std::int64_t>(b->requested));
  if (oversize) ++s.oversize_allocations;
}
void account_free(MemoryStats& s, const Block* b, bool oversize) {
  const PoolKind k = b->segment->pool;
  sub_stat(s.allocation, k, 1);
  sub_stat(s.allocated_bytes, k, static_cast<std::int64_t>(b->size));
  sub_stat(s.requested_bytes, k, static_cast<std::int64_t>(b->requested));
  if (oversize) --s.oversize_allocations;
}
// The block stops being active: it can be handed out again.
void account_inactive(MemoryStats& s, const Block* b) {
  sub_stat(s.active, b->segment->pool, 1);
  sub_stat(s.active_bytes, b->segment->pool, static_cast<std::int64_t>(b->size));
}

// Folds a thread's hot-path changes into the allocator's totals. The peak is exact when no
// other thread moved the same stat since the delta started.
void merge_stat(Stat& into, Stat& d) {
  into.peak = std::max(into.peak, into.current + d.peak);
  into.current += d.current;
  into.allocated += d.allocated;
  into.freed += d.freed;
  d = Stat{};
}
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

}  // namespace

// Everything but the hot path runs under `mutex`.
struct DeviceAllocator::Impl : std::enable_shared_from_this<DeviceAllocator::Impl> {
  Impl(SegmentBackend& b, const AllocatorOptions& o, int dev)
      : backend(b), options(o), sizes(o), device(dev) {}

  SegmentBackend& backend;
  const AllocatorOptions& options;
  SizeClasses sizes;
  int device;
  const std::uint64_t id = next_allocator_id.fetch_add(1);
  std::atomic<AllocatorObserver*> observer{nullptr};
  std::mutex mutex;

  BlockPool small_pool;
  BlockPool large_pool;
  BlockPool unmapped_pool;  // unbacked free ranges of expandable segments
  std::map<std::pair<StreamHandle, PoolKind>, Segment*> expandable;
  SegmentTable segments;
  FenceQueue fences;
  FenceClock batch_fences;  // the device fences of the thread caches' batches
  LiveMap live;
  std::vector<std::shared_ptr<ThreadCache>> caches;
  // Allocated bytes for the observer's records, kept across threads only while an observer is
  // attached (it costs a shared atomic per operation). Attach it before the first allocation.
  std::atomic<std::int64_t> allocated_now{0};
  std::atomic<std::size_t> reserved_now{0};
  MemoryStats stats;
  std::optional<OomReport> last_oom;
  std::size_t limit_override = 0;
  std::uint64_t tick = 0;

  BlockPool& pool(PoolKind kind) { return kind == PoolKind::kSmall ? small_pool : large_pool; }

  std::size_t limit() const {
    if (limit_override != 0) return limit_override;
    const std::size_t total = backend.total_memory();
    std::size_t limit = total;
    if (options.per_process_memory_fraction < 1.0) {
      limit = static_cast<std::size_t>(static_cast<double>(total) * options.per_process_memory_fraction);
    }
    if (options.memory_limit_bytes != 0) limit = std::min(limit, options.memory_limit_bytes);
    return limit;
  }

  std::size_t reserved() const { return segments.bytes(); }
  // Under the lock, after merge_deltas().
  std::size_t allocated() const { return static_cast<std::size_t>(stats.allocated_bytes[kStatAll].current); }

  void count_allocated(std::int64_t delta) {
    if (observer.load(std::memory_order_relaxed) != nullptr) {
      allocated_now.fetch_add(delta, std::memory_order_relaxed);
    }
  }

  void notify(EventKind kind, StreamHandle stream, DevicePtr ptr, std::size_t requested,
              std::size_t rounded, Status result = Status::kOk, bool async = false,
              bool hit = false) {
    AllocatorObserver* o = observer.load(std::memory_order_acquire);
    if (o == nullptr) return;
    AllocatorEvent e{};
    e.kind = kind;
    e.async = async;
    e.cache_hit = hit;
    e.result = result;
    e.device = device;
    e.stream = stream;
    e.ptr = ptr;
    e.requested = requested;
    e.rounded = rounded;
    e.allocated_after = static_cast<std::size_t>(allocated_now.load(std::memory_order_relaxed));
    e.reserved_after = reserved_now.load(std::memory_order_relaxed);
    o->on_event(e);
  }

  void add(StatArray& a, PoolKind k, std::int64_t n) { add_stat(a, k, n); }
  void sub(StatArray& a, PoolKind k, std::int64_t n) { sub_stat(a, k, n); }

  // --- thread caches
  struct LocalEntry {
    std::uint64_t id;
    std::weak_ptr<Impl> owner;
    std::shared_ptr<ThreadCache> cache;
  };
  // A thread's caches, one per allocator it used; given back when the thread exits.
  struct LocalCaches {
    std::vector<LocalEntry> entries;
    ~LocalCaches() {
      for (LocalEntry& e : entries) {
        if (auto owner = e.owner.lock()) owner->retire(e.cache);
      }
    }
  };

  ThreadCache& local_cache() {
    thread_local LocalCaches local;
    for (LocalEntry& e : local.entries) {
      if (e.id == id) return *e.cache;
    }
    std::erase_if(local.entries, [](const LocalEntry& e) { return e.owner.expired(); });
    auto cache = std::make_shared<ThreadCache>();
    {
      std::lock_guard lock(mutex);
      caches.push_back(cache);
    }
    local.entries.push_back(LocalEntry{id, weak_from_this(), cache});
    return *cache;
  }

  void retire(const std::shared_ptr<ThreadCache>& cache) {
    std::lock_guard lock(mutex);
    drain(*cache, true);
    std::erase(caches, cache);
  }

  // Folds every thread's hot-path statistics into `stats`. Done before the locked path changes
  // them, so that a peak is never taken over totals that miss another thread's frees.
  void merge_deltas() {
    for (auto& cache : caches) {
      std::lock_guard lock(cache->lock);
      merge_stats(stats, cache->delta());
      stats.num_cache_hits += cache->hits;
      cache->hits = 0;
    }
  }

  // Takes a cache's statistics, its deferred frees, its spilled blocks and, with `bins` (memory
  // is short), its cached blocks and fenced batches. Without it, a thread keeps its two newest
  // batches to refill its bins.
  void drain(ThreadCache& cache, bool bins) {
    std::lock_guard lock(cache.lock);
    merge_stats(stats, cache.delta());
    stats.num_cache_hits += cache.hits;
    cache.hits = 0;
    for (Block* b : cache.deferred()) fences.defer_to_epoch(b);
    cache.deferred().clear();
    cache.deferred_bytes() = 0;
    for (Block* b : cache.spill()) make_reusable(b);
    cache.spill().clear();
    // A batch handed over joins the open epoch: the fence that closes it comes later than
    // the batch's frees, which is all a batch needs.
    auto& batches = cache.batches();
    while (batches.size() > (bins ? 0 : 2)) {
      for (Block* b : batches.front().blocks) fences.defer_to_epoch(b);
      batches.pop_front();
    }
    if (bins) cache.drain_bins([this](Block* b) { make_reusable(b); });
  }
  // Moves the blocks of this thread's oldest batch into its bins once a device fence recorded
  // after it is done (blocks with no room in the bins are spilled to the allocator). Called by
  // the owner with the cache locked, when its bins miss.
  bool refill(ThreadCache& cache) {
    auto& batches = cache.batches();
    if (batches.empty() || !batch_fences.passed(batches.front().ticket, backend)) return false;
    for (Block* b : batches.front().blocks) {
      account_inactive(cache.delta(), b);
      if (!cache.push(b, sizes.round(b->requested))) {
        b->state = BlockState::kPending;
        cache.spill().push_back(b);
      }
    }
    batches.pop_front();
    return true;
  }

  void drain_all(bool bins) {
    for (auto& cache : caches) drain(*cache, bins);
  }

  // --- pools (they track the inactive-split statistics)
  void pool_insert(Block* b) {
    b->state = BlockState::kFree;
    if (!b->mapped) {
      unmapped_pool.insert(b);
      return;
    }
    if (b->is_split()) {
      add(stats.inactive_split, b->segment->pool, 1);
      add(stats.inactive_split_bytes, b->segment->pool, static_cast<std::int64_t>(b->size));
    }
    pool(b->segment->pool).insert(b);
  }
  void pool_erase(Block* b) {
    if (!b->mapped) {
      unmapped_pool.erase(b);
      return;
    }
    pool(b->segment->pool).erase(b);
    if (b->is_split()) {
      sub(stats.inactive_split, b->segment->pool, 1);
      sub(stats.inactive_split_bytes, b->segment->pool, static_cast<std::int64_t>(b->size));
    }
  }

  // --- finding memory
  Block* find_free(StreamHandle stream, std::size_t rounded, PoolKind kind) {
    BlockPool& p = pool(kind);
    Block* b = p.best_fit(stream, rounded);
    // Candidates come in increasing size, so when the smallest fitting block breaks the
    // max_split_size rules every larger one does too.
    if (b == nullptr || !sizes.may_serve(b->size, rounded)) return nullptr;
    pool_erase(b);
    return b;
  }

  // A freed block stops being active and becomes reusable.
  void release_block(Block* b) {
    account_inactive(stats, b);
    make_reusable(b);
  }

  // Merges a free block with free neighbours and puts it in its pool.
  void make_reusable(Block* b) {
    b->state = BlockState::kFree;
    b->stream_uses.clear();
    if (Block* prev = b->prev; prev != nullptr && prev->state == BlockState::kFree && prev->mapped == b->mapped) {
      pool_erase(prev);
      prev->size += b->size;
      prev->next = b->next;
      if (b->next) b->next->prev = prev;
      delete b;
      b = prev;
    }
    if (Block* next = b->next; next != nullptr && next->state == BlockState::kFree && next->mapped == b->mapped) {
      pool_erase(next);
      b->size += next->size;
      b->next = next->next;
      if (next->next) next->next->prev = b;
      delete next;
    }
    pool_insert(b);
    if (b->segment->idle()) b->segment->idle_since = tick;
  }

  std::size_t collect_ready() {
    return fences.collect([this](Block* b) { release_block(b); });
  }
  std::size_t wait_pending() {
    return fences.wait_all(backend, [this](Block* b) { release_block(b); });
  }

  // Whether `bytes` more can be reserved without passing the limit or the collection threshold.
  bool room_for(std::size_t bytes) const {
    std::size_t cap = limit();
    if (options.garbage_collection_threshold > 0.0) {
      cap = static_cast<std::size_t>(options.garbage_collection_threshold * static_cast<double>(cap));
    }
    return bytes <= cap && reserved() <= cap - bytes;
  }

  Block* new_segment(StreamHandle stream, std::size_t rounded, PoolKind kind) {
    const std::size_t size = SizeClasses::segment_size(rounded);
    if (size > limit() || reserved() > limit() - size) return nullptr;
    DevicePtr base = 0;
    if (backend.allocate_segment(size, &base) != Status::kOk) return nullptr;
    Segment* s = segments.add(base, size, kind, stream);
    reserved_now.store(segments.bytes(), std::memory_order_relaxed);
    ++stats.num_device_alloc;
    add(stats.segment, kind, 1);
    add(stats.reserved_bytes, kind, static_cast<std::int64_t>(size));
    if (sizes.is_oversize(size)) ++stats.oversize_segments;
    notify(EventKind::kSegmentAlloc, stream, base, size, size);
    return s->first;
  }

  void free_segment(Segment* s) {
    const PoolKind kind = s->pool;
    const DevicePtr base = s->base;
    const std::size_t size = s->size;
    const StreamHandle stream = s->stream;
    pool_erase(s->first);
    backend.free_segment(base, size);
    segments.remove(s);
    reserved_now.store(segments.bytes(), std::memory_order_relaxed);
    ++stats.num_device_free;
    sub(stats.segment, kind, 1);
    sub(stats.reserved_bytes, kind, static_cast<std::int64_t>(size));
    if (sizes.is_oversize(size)) --stats.oversize_segments;
    notify(EventKind::kSegmentFree, stream, base, size, size);
  }

  // --- expandable segments: one address range per (stream, pool), mapped as it grows, so that
  // a large block finds room at the growth point instead of a new segment being cut.
  Segment* expandable_segment(StreamHandle stream, PoolKind kind) {
    auto it = expandable.find({stream, kind});
    if (it != expandable.end()) return it->second;
    // Address space is cheap and cannot be grown in place: the device's memory plus the limit,
    // so that live blocks left anywhere in the range never stop a request the limit allows
    // from finding a contiguous range once free chunks are given back.
    const std::size_t g = backend.vm_granularity();
    const std::size_t va = (backend.total_memory() + limit() + g - 1) / g * g;
    DevicePtr base = 0;
    if (va == 0 || backend.reserve_address(va, &base) != Status::kOk) return nullptr;
    Segment* s = segments.add_expandable(base, va, kind, stream);
    unmapped_pool.insert(s->first);
    add(stats.segment, kind, 1);
    expandable.emplace(std::make_pair(stream, kind), s);
    return s;
  }

  // Splits `b` at `offset`; the new block after it shares its state and mapping.
  static Block* split_at(Block* b, std::size_t offset) {
    auto* rest = new Block;
    rest->ptr = b->ptr + offset;
    rest->size = b->size - offset;
    rest->stream = b->stream;
    rest->segment = b->segment;
    rest->mapped = b->mapped;
    rest->state = b->state;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = offset;
    return rest;
  }

  // Maps just enough of the first unmapped range that, with the free mapped block before it,
  // holds the request; returns that block, out of its pool.
  Block* grow(StreamHandle stream, std::size_t rounded, PoolKind kind) {
    Segment* s = expandable_segment(stream, kind);
    if (s == nullptr) return nullptr;
    const std::size_t g = backend.vm_granularity();
    for (Block* u = s->first; u != nullptr; u = u->next) {
      if (u->mapped || u->state != BlockState::kFree) continue;
      Block* before = u->prev;
      const std::size_t have =
          before != nullptr && before->mapped && before->state == BlockState::kFree ? before->size : 0;
      if (have + u->size < rounded) continue;
      const std::size_t need = std::min(u->size, (rounded - have + g - 1) / g * g);
      if (need > limit() || reserved() > limit() - need) return nullptr;
      if (backend.map(u->ptr, need) != Status::kOk) return nullptr;
      s->chunks.emplace(u->ptr, need);
      segments.note_mapped(s, static_cast<std::ptrdiff_t>(need));
      reserved_now.store(segments.bytes(), std::memory_order_relaxed);
      ++stats.num_device_alloc;
      add(stats.reserved_bytes, kind, static_cast<std::int64_t>(need));
      notify(EventKind::kSegmentAlloc, stream, u->ptr, need, need);
      pool_erase(u);
      if (u->size > need) pool_insert(split_at(u, need));
      u->mapped = true;
      make_reusable(u);  // joins the free block before it
      return find_free(stream, rounded, kind);
    }
    return nullptr;
  }

  // Gives back every mapped chunk of `s` that lies inside a free block, once the segment's
  // stream has passed its frees (the device may still be reading a block freed in stream order).
  std::size_t unmap_free_chunks(Segment* s, std::size_t stop_below) {
    if (s->stream != kNoStream) {
      auto fence = backend.record_fence(s->stream);
      if (!fence->wait()) return 0;
    }
    std::size_t released = 0;
    for (auto it = s->chunks.begin(); it != s->chunks.end() && reserved() > stop_below;) {
      const auto [start, bytes] = *it;
      Block* b = SegmentTable::block_containing(*s, start);
      const bool inside = b != nullptr && b->mapped && b->state == BlockState::kFree &&
                          start + bytes <= b->ptr + b->size;
      if (!inside || backend.unmap(start, bytes) != Status::kOk) {
        ++it;
        continue;
      }
      pool_erase(b);
      if (b->ptr + b->size > start + bytes) pool_insert(split_at(b, start + bytes - b->ptr));
      Block* gone = b->ptr < start ? split_at(b, start - b->ptr) : b;
      if (gone != b) pool_insert(b);
      gone->mapped = false;
      make_reusable(gone);  // joins neighbouring unmapped ranges
      segments.note_mapped(s, -static_cast<std::ptrdiff_t>(bytes));
      reserved_now.store(segments.bytes(), std::memory_order_relaxed);
      ++stats.num_device_free;
      sub(stats.reserved_bytes, s->pool, static_cast<std::int64_t>(bytes));
      notify(EventKind::kSegmentFree, s->stream, start, bytes, bytes);
      released += bytes;
      it = s->chunks.erase(it);
    }
    return released;
  }

  std::size_t unmap_all_free_chunks(std::size_t stop_below = 0) {
    std::size_t released = 0;
    for (auto& [key, s] : expandable) released += unmap_free_chunks(s, stop_below);
    return released;
  }

  Block* obtain(StreamHandle stream, std::size_t rounded, PoolKind kind) {
    return options.expandable_segments ? grow(stream, rounded, kind) : new_segment(stream, rounded, kind);
  }

  template <typename Pred>
  std::vector<Segment*> idle_segments(Pred&& pred) {
    std::vector<Segment*> out;
    segments.for_each([&](Segment* s) {
      if (s->idle() && pred(s)) out.push_back(s);
    });
    return out;
  }

  std::size_t release_idle(std::vector<Segment*> victims) {
    std::size_t released = 0;
    for (Segment* s : victims) {
      released += s->size;
      free_segment(s);
    }
    return released;
  }

  // Garbage collection: above the threshold, give back the longest-idle segments first.
  void collect_garbage() {
    if (options.garbage_collection_threshold <= 0.0) return;
    const auto target =
        static_cast<std::size_t>(options.garbage_collection_threshold * static_cast<double>(limit()));
    if (reserved() <= target) return;
    auto victims = idle_segments([](Segment*) { return true; });
    std::sort(victims.begin(), victims.end(),
              [](Segment* a, Segment* b) { return a->idle_since < b->idle_since; });
    for (Segment* s : victims) {
      if (reserved() <= target) break;
      free_segment(s);
    }
    if (reserved() > target) unmap_all_free_chunks(target);
  }

  // Oversize idle blocks go back first: the best fitting one, else the largest ones until
  // enough is free.
  bool release_oversize(std::size_t rounded) {
    if (options.max_split_size == std::numeric_limits<std::size_t>::max()) return false;
    auto victims = idle_segments([this](Segment* s) { return sizes.is_oversize(s->size); });
    if (victims.empty()) return false;
    std::sort(victims.begin(), victims.end(), [](Segment* a, Segment* b) { return a->size < b->size; });
    const std::size_t wanted = std::max(rounded, options.max_split_size);
    auto fit = std::find_if(victims.begin(), victims.end(), [&](Segment* s) { return s->size >= wanted; });
    if (fit != victims.end()) {
      free_segment(*fit);
      return true;
    }
    std::size_t released = 0;
    while (!victims.empty() && released < wanted) {
      released += victims.back()->size;
      free_segment(victims.back());
      victims.pop_back();
    }
    return true;
  }

  // A wholly idle segment of another stream can serve this one once that stream has passed
  // the point of the free. A fence recorded now lies after the free, so its completion is
  // enough; blocks from cudaFree (kNoStream) were device-fenced already.
  Block* adopt_idle_segment(StreamHandle stream, std::size_t rounded, PoolKind kind) {
    Segment* best = nullptr;
    segments.for_each([&](Segment* s) {
      if (s->stream == stream || s->pool != kind || !s->idle()) return;
      if (s->size < rounded || !sizes.may_serve(s->size, rounded)) return;
      if (best == nullptr || s->size < best->size) best = s;
    });
    if (best == nullptr) return nullptr;
    if (best->stream != kNoStream && !backend.record_fence(best->stream)->done()) return nullptr;
    Block* b = best->first;
    pool_erase(b);
    best->stream = stream;
    b->stream = stream;
    return b;
  }

  std::size_t release_everything_idle() {
    drain_all(true);
    wait_pending();
    const std::size_t released =
        release_idle(idle_segments([](Segment*) { return true; })) + unmap_all_free_chunks();
    notify(EventKind::kCacheRelease, 0, 0, released, released);
    return released;
  }

  // Hands `b` (free, out of its pool) to the program, splitting off what it does not need.
  void take(Block* b, std::size_t requested, std::size_t rounded) {
    if (sizes.should_split(b->size, rounded, b->segment->pool)) {
      auto* rest = new Block;
      rest->ptr = b->ptr + rounded;
      rest->size = b->size - rounded;
      rest->stream = b->stream;
      rest->segment = b->segment;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = rounded;
      pool_insert(rest);
    }
    b->state = BlockState::kAllocated;
    b->requested = requested;
    account_alloc(stats, b, sizes.is_oversize(b->size));
    count_allocated(static_cast<std::int64_t>(b->size));
    live.insert(b->ptr, b);
  }

  OomReport make_oom_report(std::size_t requested, std::size_t rounded, StreamHandle stream) {
    OomReport r;
    r.device = device;
    r.stream = stream;
    r.requested = requested;
    r.rounded = rounded;
    r.limit = limit();
    r.device_total = backend.total_memory();
    r.allocated = allocated();
    r.reserved = reserved();
    r.largest_free_block = std::max(small_pool.largest(), large_pool.largest());
    r.pending_free = fences.pending_bytes();
    r.free_fragmented = small_pool.bytes() + large_pool.bytes();
    return r;
  }

  Status allocate(std::size_t bytes, StreamHandle stream, DevicePtr* out, bool async) {
    *out = 0;
    if (bytes == 0) return Status::kInvalidValue;
    ++tick;
    merge_deltas();
    // Past this, rounding would overflow; no device has that much memory anyway.
    constexpr std::size_t kMaxRequest = std::numeric_limits<std::size_t>::max() / 2;
    const std::size_t rounded = bytes > kMaxRequest ? kMaxRequest : sizes.round(bytes);
    const PoolKind kind = SizeClasses::pool_for(rounded);

    bool hit = true;
    Block* b = bytes > kMaxRequest ? nullptr : find_free(stream, rounded, kind);
    if (b == nullptr && bytes <= kMaxRequest) {
      // Blocks parked in thread caches go back to the pools before any new memory is cut.
      drain_all(true);
      b = find_free(stream, rounded, kind);
      if (b == nullptr && collect_ready() > 0) b = find_free(stream, rounded, kind);
      // The epoch is fenced once it is worth a fence, or when new memory would be short.
      if (b == nullptr && fences.epoch_open() &&
          (fences.epoch_bytes() >= options.free_epoch_bytes || !room_for(SizeClasses::segment_size(rounded)))) {
        fences.close_epoch(backend);
        if (collect_ready() > 0) b = find_free(stream, rounded, kind);
      }
      if (b == nullptr) b = adopt_idle_segment(stream, rounded, kind);
      if (b == nullptr) {
        hit = false;
        collect_garbage();
        b = obtain(stream, rounded, kind);
      }
      if (b == nullptr && release_oversize(rounded)) b = obtain(stream, rounded, kind);
      if (b == nullptr) {
        ++stats.num_alloc_retries;
        release_everything_idle();
        b = find_free(stream, rounded, kind);
        if (b == nullptr) b = obtain(stream, rounded, kind);
      }
    }
    if (b == nullptr) {
      ++stats.num_ooms;
      last_oom = make_oom_report(bytes, rounded, stream);
      notify(EventKind::kOom, stream, 0, bytes, rounded, Status::kOutOfMemory, async);
      return Status::kOutOfMemory;
    }
    take(b, bytes, rounded);
    if (hit) ++stats.num_cache_hits; else ++stats.num_cache_misses;
    *out = b->ptr;
    notify(EventKind::kAlloc, stream, b->ptr, bytes, b->size, Status::kOk, async, hit);
    return Status::kOk;
  }

  // `b` was taken out of the live map by the caller.
  void free(Block* b, FreeOrder order, StreamHandle stream, bool async) {
    merge_deltas();
    const DevicePtr ptr = b->ptr;
    account_free(stats, b, sizes.is_oversize(b->size));
    count_allocated(-static_cast<std::int64_t>(b->size));
    const std::size_t requested = b->requested;
    const std::size_t size = b->size;
    b->state = BlockState::kPending;

    switch (order) {
      case FreeOrder::kCompleted:
        release_block(b);
        break;
      case FreeOrder::kDevice:
        fences.defer_to_epoch(b);
        break;
      case FreeOrder::kStream: {
        // Work on the block's own stream is ordered before its next use there; work on the
        // freeing stream and on recorded extra streams is not.
        std::vector<StreamHandle> uses = std::move(b->stream_uses);
        b->stream_uses.clear();
        if (stream != b->stream && std::find(uses.begin(), uses.end(), stream) == uses.end()) {
          uses.push_back(stream);
        }
        if (uses.empty()) {
          release_block(b);
        } else {
          for (StreamHandle s : uses) fences.add(backend.record_fence(s), b);
        }
        break;
      }
    }
    notify(EventKind::kFree, stream, ptr, requested, size, Status::kOk, async);
  }
};

DeviceAllocator::DeviceAllocator(SegmentBackend& backend, const AllocatorOptions& options, int device)
    : options_(options), device_(device), impl_(std::make_shared<Impl>(backend, options_, device)) {}

DeviceAllocator::~DeviceAllocator() = default;

Status DeviceAllocator::allocate(std::size_t bytes, StreamHandle stream, DevicePtr* out, bool async) {
  Impl& m = *impl_;
  if (m.options.thread_cache && bytes != 0 && bytes <= kSmallSize) {
    // Hot path: an exact-size block from this thread's cache.
    const std::size_t rounded = m.sizes.round(bytes);
    ThreadCache& cache = m.local_cache();
    Block* b = nullptr;
    bool spilled = false;
    {
      std::lock_guard lock(cache.lock);
      b = cache.pop(stream, rounded);
      if (b == nullptr && m.refill(cache)) b = cache.pop(stream, rounded);
      if (b != nullptr) {
        b->state = BlockState::kAllocated;
        b->requested = bytes;
        account_alloc(cache.delta(), b, m.sizes.is_oversize(b->size));
        ++cache.hits;
      }
      spilled = !cache.spill().empty();
    }
    if (spilled) {
      std::lock_guard lock(m.mutex);
      m.drain(cache, false);
    }
    if (b != nullptr) {
      m.count_allocated(static_cast<std::int64_t>(b->size));
      m.live.insert(b->ptr, b);
      *out = b->ptr;
      m.notify(EventKind::kAlloc, stream, b->ptr, bytes, b->size, Status::kOk, async, true);
      return Status::kOk;
    }
  }
  std::lock_guard lock(m.mutex);
  return m.allocate(bytes, stream, out, async);
}

Status DeviceAllocator::free(DevicePtr ptr, FreeOrder order, StreamHandle stream, bool async) {
  Impl& m = *impl_;
  Block* b = m.live.take(ptr);
  if (b == nullptr) return Status::kInvalidValue;  // unknown, interior, or already freed
  // Hot path: a block reusable at once goes to this thread's cache; a cudaFree'd one waits
  // there for the next device fence.
  const bool reusable = order == FreeOrder::kCompleted ||
                        (order == FreeOrder::kStream && stream == b->stream && b->stream_uses.empty());
  // Only small blocks are cached per thread: large ones parked there would stop their
  // neighbours from coalescing, and fragmentation costs more than a lock at those sizes.
  if (m.options.thread_cache && b->segment->pool == PoolKind::kSmall &&
      (reusable || order == FreeOrder::kDevice)) {
    ThreadCache& cache = m.local_cache();
    const std::size_t size = b->size;
    const std::size_t requested = b->requested;
    bool cached = false;
    bool hand_over = false;
    {
      std::lock_guard lock(cache.lock);
      account_free(cache.delta(), b, m.sizes.is_oversize(b->size));
      if (reusable) {
        account_inactive(cache.delta(), b);
        cached = cache.push(b, m.sizes.round(requested));
        if (!cached) b->state = BlockState::kPending;
      } else {
        b->state = BlockState::kPending;
        b->stream_uses.clear();
        cache.deferred().push_back(b);
        cache.deferred_bytes() += b->size;
        cached = true;
        // A full batch is closed with a ticket; the first thread whose bins run dry records
        // one device fence for every batch closed so far (fence_clock.h). Too many outstanding
        // batches go to the allocator instead.
        if (cache.batch_due()) cache.close_batch(m.batch_fences.stamp());
        hand_over = cache.batches().size() > 8 || cache.deferred().size() >= ThreadCache::kMaxDeferred;
      }
    }
    m.count_allocated(-static_cast<std::int64_t>(size));
    m.notify(EventKind::kFree, stream, ptr, requested, size, Status::kOk, async);
    if (cached && !hand_over) return Status::kOk;
    std::lock_guard lock(m.mutex);
    if (!cached) m.make_reusable(b);  // its bin was full
    if (hand_over) m.drain(cache, false);
    return Status::kOk;
  }
  std::lock_guard lock(m.mutex);
  m.free(b, order, stream, async);
  return Status::kOk;
}

Status DeviceAllocator::record_stream(DevicePtr ptr, StreamHandle stream) {
  std::lock_guard lock(impl_->mutex);
  Block* b = impl_->live.get(ptr);
  if (b == nullptr) return Status::kInvalidValue;
  if (stream != b->stream &&
      std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
  return Status::kOk;
}

void DeviceAllocator::set_observer(AllocatorObserver* observer) {
  impl_->observer.store(observer, std::memory_order_release);
}

std::optional<AllocationInfo> DeviceAllocator::find(DevicePtr ptr) const {
  std::lock_guard lock(impl_->mutex);
  const Segment* s = impl_->segments.containing(ptr);
  if (s == nullptr) return std::nullopt;
  const Block* b = SegmentTable::block_containing(*s, ptr);
  if (b == nullptr || b->state != BlockState::kAllocated) return std::nullopt;
  return AllocationInfo{b->ptr, b->size, b->requested, b->stream, s->base, s->size};
}

bool DeviceAllocator::owns(DevicePtr ptr) const {
  // The common case, a live block's start, needs no lock: frees ask this first.
  if (impl_->live.get(ptr) != nullptr) return true;
  std::lock_guard lock(impl_->mutex);
  return impl_->segments.containing(ptr) != nullptr;
}

std::size_t DeviceAllocator::release_cached() {
  std::lock_guard lock(impl_->mutex);
  return impl_->release_everything_idle();
}

void DeviceAllocator::synchronize_pending() {
  std::lock_guard lock(impl_->mutex);
  impl_->drain_all(false);
  impl_->wait_pending();
}

void DeviceAllocator::forget_all() {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  for (auto& cache : m.caches) {
    std::lock_guard cache_lock(cache->lock);
    cache->drain_bins([](Block*) {});
    cache->deferred().clear();
    cache->deferred_bytes() = 0;
    cache->batches().clear();
    cache->spill().clear();
    cache->delta() = MemoryStats{};
    cache->hits = 0;
  }
  m.fences.clear();
  m.batch_fences.clear();
  m.live.clear();
  m.small_pool.clear();
  m.large_pool.clear();
  m.unmapped_pool.clear();
  m.expandable.clear();
  m.segments.clear();
  m.reserved_now.store(0);
  m.allocated_now.store(0);
  MemoryStats fresh;
  fresh.num_alloc_retries = m.stats.num_alloc_retries;
  fresh.num_ooms = m.stats.num_ooms;
  fresh.num_device_alloc = m.stats.num_device_alloc;
  fresh.num_device_free = m.stats.num_device_free;
  fresh.num_cache_hits = m.stats.num_cache_hits;
  fresh.num_cache_misses = m.stats.num_cache_misses;
  m.stats = fresh;
}

MemoryStats DeviceAllocator::stats() const {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  m.merge_deltas();
  return m.stats;
}

void DeviceAllocator::reset_peak_stats() {
  std::lock_guard lock(impl_->mutex);
  impl_->merge_deltas();
  impl_->stats.reset_peaks();
}

std::string DeviceAllocator::summary() const {
  const MemoryStats s = stats();
  return format_memory_summary(s, device_, memory_limit());
}

std::optional<OomReport> DeviceAllocator::last_oom() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->last_oom;
}

std::size_t DeviceAllocator::cached_bytes() const {
  std::lock_guard lock(impl_->mutex);
  impl_->merge_deltas();
  return impl_->reserved() - impl_->allocated();
}

std::size_t DeviceAllocator::memory_limit() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->limit();
}

void DeviceAllocator::set_memory_limit(std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  impl_->limit_override = bytes;
}

}  // namespace cudalloc
