// The device allocator's public API and its locked allocate/free ladder: how a request that
// the calling thread's cache cannot serve is met (pools, fenced frees, another stream's idle
// segment, new device memory, then the reclaim steps of reclaim.cpp, in that order), and how a
// block freed under the lock becomes reusable. The lock-free hot paths of allocate and free are
// in thread_cache_paths.cpp, the shared state in device_allocator_impl.h.
#include "allocator/device_allocator.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <vector>

#include "allocator/allocator_stats.h"
#include "allocator/device_allocator_impl.h"

namespace cudalloc {

namespace {

std::atomic<std::uint64_t> next_allocator_id{1};

// Buffer ids (CU_POINTER_ATTRIBUTE_BUFFER_ID) of the blocks handed out, one per hand-out, never
// reused in the process: natively every allocation has its own, and registration caches (UCX,
// MPI, NCCL) key on it to notice that an address now belongs to another allocation. One
// counter for every allocator of the process; the top bit keeps them apart from the driver's
// own ids, which count from 1. A hand-out takes its id when the program first asks for it, not
// when the block is handed out: a cached allocate only clears the block's has_buffer_id.
constexpr std::uint64_t kBufferIdMark = std::uint64_t{1} << 63;
std::atomic<std::uint64_t> last_buffer_id{kBufferIdMark};

}  // namespace

using Impl = DeviceAllocator::Impl;

Impl::Impl(SegmentBackend& b, const AllocatorOptions& o, int dev)
    : backend(b), options(o), sizes(o), device(dev), id(next_allocator_id.fetch_add(1)) {}

// A freed block stops being active and becomes reusable.
void Impl::release_block(Block* b) {
  account_inactive(stats.totals, b);
  blocks.make_reusable(b);
}

std::size_t Impl::collect_ready() {
  return fences.collect([this](Block* b) { release_block(b); });
}

std::size_t Impl::wait_pending() {
  return fences.wait_all(backend, [this](Block* b) { release_block(b); });
}

// Hands `b` (free, out of its pool) to the program, splitting off what it does not need.
void Impl::take(Block* b, std::size_t requested, std::size_t rounded) {
  if (sizes.should_split(b->size, rounded, b->segment->pool)) blocks.insert(FreeBlocks::split_at(b, rounded));
  b->state = BlockState::kAllocated;
  b->requested = requested;
  b->has_buffer_id = false;
  // Its free parks it in this thread's large bins only if this thread took it.
  if (b->pool == PoolKind::kLarge) b->taker = find_local_cache();
  account_alloc(stats.totals, b, sizes.is_oversize(b->size));
  events.count_allocated(static_cast<std::int64_t>(b->size));
  live.insert(b->ptr, b);
}

// cudaFree'd large blocks wait in the open epoch, out of the pool's best fit: the pool then
// splits a bigger free block for a request that one of them would have served, and the waste
// piles up (a training trace replayed as cudaMalloc/cudaFree, the device keeping up, used its
// reserved memory far worse than with the same frees in stream order). So when the best fit `fit` would
// be split and the epoch holds a block that could serve, the epoch is closed now, provided the
// device has passed the fence of the epoch closed before: it keeps up, so this fence is likely
// passed at once. Returns the best fit after that.
// Not when nothing fits: closing then made a loop of cudaMalloc/cudaFree pairs record a fence
// per pair (a driver call per pair, several times the pair's cost) and gained the replays
// nothing. Behind a lagging device, closing at every such request only adds fences.
Block* Impl::reach_epoch(Block* fit, StreamHandle stream, std::size_t rounded) {
  const PoolKind kind = PoolKind::kLarge;
  if (!fences.epoch_holds(kind, rounded)) return fit;
  if (fit == nullptr || !sizes.should_split(fit->size, rounded, kind)) return fit;
  if (!fences.newest_epoch_passed()) return fit;
  blocks.insert(fit);
  fences.close_epoch(backend);
  collect_ready();
  return blocks.find(stream, rounded, kind);
}

Status Impl::allocate(std::size_t bytes, StreamHandle stream, DevicePtr* out, CallKind call, Try attempt,
                      Bridge bridge) {
  *out = 0;
  if (bytes == 0) return Status::kInvalidValue;
  ++tick;
  if (attempt != Try::kAgain) ++stats.totals.num_locked_allocs;
  if (bridge == Bridge::kYes) ++stats.totals.num_bridged_allocs;
  stats.merge(caches);
  take_back_refused();
  oom.start_try();
  // Past kMaxRoundable, rounding would overflow; no device has that much memory anyway.
  constexpr std::size_t kMaxRequest = kMaxRoundable;
  const std::size_t rounded = bytes > kMaxRequest ? kMaxRequest : sizes.round(bytes);
  const PoolKind kind = SizeClasses::pool_for(rounded);

  // A large request that missed this thread's bins first gives back what the thread parked
  // there, so that the pool's best fit sees every free block, as it would without the bins.
  if (kind == PoolKind::kLarge) drain_own_large();
  CacheHit hit = CacheHit::kHit;
  Block* b = bytes > kMaxRequest ? nullptr : blocks.find(stream, rounded, kind);
  if (kind == PoolKind::kLarge) b = reach_epoch(b, stream, rounded);
  if (b == nullptr && bytes <= kMaxRequest) {
    // Small blocks parked in this thread's cache go back to the pools before new small memory
    // is cut, and every thread's when that memory would be short. Draining every thread on
    // every miss kept the others from closing batches of their own (their open cudaFree
    // batches went to the epoch), so each miss caused more: threads of cudaMalloc+cudaFree
    // pairs then ran over twenty times slower. Other threads' parked blocks may cost a program a
    // few more small segments. Small blocks cannot serve a large
    // request (the pools do not share segments), so a large miss leaves the small bins warm.
    // A bridge (allocate_missed) keeps the thread's cache: draining it would restart the
    // thread's pipeline, which the bridge is there to deepen.
    if (!memory_limit.room_for(SizeClasses::segment_size(rounded))) {
      drain_all(Drain::kWithBins);
    } else if (kind == PoolKind::kSmall && bridge == Bridge::kNo) {
      drain_own();
    }
    b = blocks.find(stream, rounded, kind);
    if (b == nullptr && collect_ready() > 0) b = blocks.find(stream, rounded, kind);
    // The epoch is fenced once it is worth a fence, or when new memory would be short.
    if (b == nullptr && fences.epoch_open() &&
        (fences.epoch_bytes() >= options.free_epoch_bytes ||
         !memory_limit.room_for(SizeClasses::segment_size(rounded)))) {
      fences.close_epoch(backend);
      if (collect_ready() > 0) b = blocks.find(stream, rounded, kind);
    }
    // A program far ahead of the GPU: wait for the oldest fence rather than grow without bound
    // (only for the pool asked from: the other pool's pending blocks cannot serve this).
    while (b == nullptr && options.max_pending_bytes != 0 && fences.pending_bytes(kind) > options.max_pending_bytes) {
      fences.close_epoch(backend);
      if (!fences.wait_oldest([this](Block* x) { release_block(x); })) break;
      ++stats.totals.num_pending_waits;
      b = blocks.find(stream, rounded, kind);
    }
    if (b == nullptr) b = adopt_idle_segment(stream, rounded, kind);
    if (b == nullptr) {
      hit = CacheHit::kMiss;
      collect_garbage();
      b = obtain(stream, rounded, kind);
    }
    // A refusal that is not for want of memory ends the ladder: releasing cache cannot help.
    if (b == nullptr && !oom.device_refused() && release_oversize(rounded)) b = obtain(stream, rounded, kind);
    if (b == nullptr && !oom.device_refused()) {
      if (attempt != Try::kAgain) ++stats.totals.num_alloc_retries;
      release_idle();
      b = blocks.find(stream, rounded, kind);
      if (b == nullptr) b = obtain(stream, rounded, kind);
    }
  }
  if (b == nullptr && oom.device_refused()) {
    events.notify({.kind = EventKind::kOom, .stream = stream, .requested = bytes, .rounded = rounded,
                   .result = oom.device_error(), .call = call});
    return oom.device_error();
  }
  if (b == nullptr) return attempt == Try::kFirst ? Status::kOutOfMemory : out_of_memory(bytes, stream, call);
  take(b, bytes, rounded);
  if (hit == CacheHit::kHit) ++stats.totals.num_cache_hits; else ++stats.totals.num_cache_misses;
  *out = b->ptr;
  events.notify({.kind = EventKind::kAlloc, .stream = stream, .ptr = b->ptr, .requested = bytes,
                 .rounded = b->size, .call = call, .hit = hit});
  return Status::kOk;
}

// Under the lock, the statistics merged.
Status Impl::out_of_memory(std::size_t bytes, StreamHandle stream, CallKind call) {
  const std::size_t rounded = bytes > kMaxRoundable ? 0 : sizes.round(bytes);  // 0: cannot be rounded
  ++stats.totals.num_ooms;
  oom.record(make_oom_report(bytes, rounded, stream));
  events.notify({.kind = EventKind::kOom, .stream = stream, .requested = bytes, .rounded = rounded,
                 .result = Status::kOutOfMemory, .call = call});
  return Status::kOutOfMemory;
}

// `b` was taken out of the live map by the caller.
void Impl::free(Block* b, FreeOrder order, StreamHandle stream, CallKind call) {
  ++stats.totals.num_locked_frees;
  stats.merge(caches);
  const DevicePtr ptr = b->ptr;
  account_free(stats.totals, b, sizes.is_oversize(b->size));
  events.count_allocated(-static_cast<std::int64_t>(b->size));
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
  events.notify({.kind = EventKind::kFree, .stream = stream, .ptr = ptr, .requested = requested, .rounded = size,
                 .call = call});
}

namespace {
// Page stitching is a way of running expandable segments: it asks for them. A device without
// virtual memory gets neither.
bool wants_expandable(const AllocatorOptions& o) { return o.expandable_segments || o.page_stitching; }

AllocatorOptions in_force(AllocatorOptions o, bool virtual_memory) {
  o.expandable_segments = wants_expandable(o) && virtual_memory;
  o.page_stitching = o.page_stitching && virtual_memory;
  return o;
}
}  // namespace

DeviceAllocator::DeviceAllocator(SegmentBackend& backend, const AllocatorOptions& options, int device)
    : expandable_ignored_(wants_expandable(options) && !backend.supports_virtual_memory()),
      options_(in_force(options, backend.supports_virtual_memory())),
      device_(device),
      impl_(std::make_shared<Impl>(backend, options_, device)) {
  // Weak: a backend may outlive its allocator.
  backend.set_deferred_done([weak = std::weak_ptr<Impl>(impl_)](DevicePtr ptr, std::size_t bytes, bool freed) {
    if (auto m = weak.lock()) m->deferred_done(ptr, bytes, freed);
  });
}

DeviceAllocator::~DeviceAllocator() = default;

Status DeviceAllocator::record_stream(DevicePtr ptr, StreamHandle stream) {
  std::lock_guard lock(impl_->mutex);
  Block* b = impl_->find_live_locked(ptr);
  if (b == nullptr) return Status::kInvalidValue;
  if (stream != b->stream &&
      std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
  return Status::kOk;
}

void DeviceAllocator::set_observer(AllocatorObserver* observer) {
  impl_->events.attach(observer);
}

std::optional<AllocationInfo> DeviceAllocator::find(DevicePtr ptr) const {
  std::lock_guard lock(impl_->mutex);
  const Segment* s = impl_->segments.containing(ptr);
  if (s == nullptr) return std::nullopt;
  Block* b = SegmentTable::block_containing(*s, ptr);
  if (b == nullptr || b->state != BlockState::kAllocated) return std::nullopt;
  // The lock orders this with every other query; the hot path, which clears the flag, hands
  // out only blocks that are not allocated.
  if (!b->has_buffer_id) {
    b->buffer_id = last_buffer_id.fetch_add(1, std::memory_order_relaxed) + 1;
    b->has_buffer_id = true;
  }
  return AllocationInfo{b->ptr, b->size, b->requested, b->stream, s->base, s->size, b->buffer_id};
}

CUDALLOC_HOT bool DeviceAllocator::owns(DevicePtr ptr) const {
  // Not ours (the driver's pools, another device's memory): told without a lock.
  if (!impl_->regions.may_hold(ptr)) return false;
  // The common case, a live block's start freed on the thread that allocated it, needs no
  // device lock: frees ask this first.
  if (impl_->live_here(ptr)) return true;
  std::lock_guard lock(impl_->mutex);
  return impl_->segments.containing(ptr) != nullptr;
}

std::size_t DeviceAllocator::release_cached(std::size_t keep) {
  std::lock_guard lock(impl_->mutex);
  if (keep != 0 && impl_->reserved() <= keep) return 0;  // nothing to trim: no wait either
  return impl_->release_idle(keep);
}

void DeviceAllocator::synchronize_pending() {
  std::lock_guard lock(impl_->mutex);
  impl_->drain_all(Impl::Drain::kPending);
  impl_->wait_pending();
}

void DeviceAllocator::forget_all() {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  m.stats.merge(m.caches);  // the cumulative counts the thread caches have not folded in yet
  m.take_back_refused();  // went with the context too: forgotten (and reported) with the rest
  for (auto& cache : m.caches) {
    std::lock_guard cache_lock(cache->lock);
    cache->drain_bins([](Block*) {});
    cache->forget_pending();
    cache->spill().clear();
    cache->reset_delta();
    cache->reset_bridges();
    cache->live.clear();
  }
  m.report_forgotten();
  m.fences.clear();
  m.batch_fences.clear();
  m.live.clear();
  m.blocks.clear();
  m.expandable.clear();
  m.memory_limit.unclaim(m.segments.bytes());  // the context took its memory with it
  m.segments.clear();
  m.events.forget();
  m.stats.forget_memory();
}

MemoryStats DeviceAllocator::stats() const {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  m.stats.merge(m.caches);
  return m.stats.totals;
}

void DeviceAllocator::reset_peak_stats() {
  std::lock_guard lock(impl_->mutex);
  impl_->stats.merge(impl_->caches);
  impl_->stats.totals.reset_peaks();
}

std::string DeviceAllocator::summary() const {
  const MemoryStats s = stats();
  const char* note =
      expandable_ignored_ ? "expandable_segments ignored: the device has no virtual memory management" : "";
  return format_memory_summary(s, device_, memory_limit(), note);
}

std::optional<OomReport> DeviceAllocator::last_oom() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->oom.last();
}

std::size_t DeviceAllocator::cached_bytes() const {
  std::lock_guard lock(impl_->mutex);
  impl_->stats.merge(impl_->caches);
  return impl_->reserved() - impl_->stats.allocated();
}

std::size_t DeviceAllocator::memory_limit() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->memory_limit.in_force();
}

std::size_t DeviceAllocator::budget_held() const {
  std::lock_guard lock(impl_->mutex);  // the budget's pointer, not its count, needs it
  return impl_->memory_limit.held();
}

void DeviceAllocator::share_budget(std::shared_ptr<DeviceBudget> budget) {
  std::lock_guard lock(impl_->mutex);
  impl_->memory_limit.share(std::move(budget));
}

void DeviceAllocator::set_reclaimer(std::function<bool()> reclaim) {
  std::lock_guard lock(impl_->mutex);
  impl_->oom.set_reclaimer(std::move(reclaim));
}

void DeviceAllocator::set_memory_limit(std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  impl_->memory_limit.set_override(bytes);
}

}  // namespace cudalloc
