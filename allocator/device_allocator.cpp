// The device allocator's public API, but for allocate and free: construction, queries, the
// statistics, limits and releases, each under the device lock. The hot paths of allocate and
// free are in thread_cache_paths.cpp, the locked ladder behind them in ladder.cpp, the state
// they share in device_allocator_impl.h.
#include "allocator/device_allocator.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <vector>

#include "allocator/device_allocator_impl.h"

namespace cudalloc {

namespace {

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
  // Acquired: a hand-out on a thread's hot path (count_hit) sets the state last.
  if (b == nullptr || b->state.load_acquire() != BlockState::kAllocated) return std::nullopt;
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
    cache->clear_spill();
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
  MemoryStats out = m.stats.totals;
  for (const auto& cache : m.caches) {
    std::lock_guard cache_lock(cache->lock);
    const auto held = static_cast<std::int64_t>(cache->held_bytes());
    ++out.thread_caches;
    out.thread_cache_bytes += held;
    out.thread_cache_max_bytes = std::max(out.thread_cache_max_bytes, held);
  }
  return out;
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
