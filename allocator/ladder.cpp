// The locked allocate/free ladder: how a request that the calling thread's cache cannot serve
// is met (pools, fenced frees, another stream's idle segment, new device memory, then the
// reclaim steps of reclaim.cpp, in that order), and how a block freed under the lock becomes
// reusable. Everything here runs under the device lock.
#include <algorithm>
#include <atomic>
#include <vector>

#include "allocator/allocator_stats.h"
#include "allocator/device_allocator_impl.h"

namespace cudalloc {

namespace {
std::atomic<std::uint64_t> next_allocator_id{1};
}  // namespace

using Impl = DeviceAllocator::Impl;

Impl::Impl(SegmentBackend& b, const AllocatorOptions& o, int dev)
    : backend(b), options(o), sizes(o), device(dev), id(next_allocator_id.fetch_add(1)) {
  batch_fences.attach(b);
}

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
  // Its free parks it in this thread's large bins, or counts on the submission watch, only if
  // this thread took it.
  b->taker = find_local_cache();
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
    if (b == nullptr && kind == PoolKind::kLarge && release_all_passed_batches()) b = blocks.find(stream, rounded, kind);
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

}  // namespace cudalloc
