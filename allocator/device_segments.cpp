// Getting memory from the device and giving it back: plain segments (one device allocation
// each, cut into blocks), the choice between them and expandable segments, and the ledger both
// report to (the limit, the reserved-bytes statistics, the observer's segment events). Kept
// apart from the allocation ladder, which only decides *when* to ask for memory.
#include "allocator/allocator_stats.h"
#include "allocator/device_allocator_impl.h"

namespace cudalloc {

using Impl = DeviceAllocator::Impl;

bool Impl::claim(std::size_t bytes) { return budget->claim(bytes, limit()); }

void Impl::unclaim(std::size_t bytes) { budget->release(bytes); }

void Impl::note_device_alloc(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) {
  regions.add(ptr, bytes);
  reserved_now.store(segments.bytes(), std::memory_order_relaxed);
  ++stats.num_device_alloc;
  add_stat(stats.reserved_bytes, kind, static_cast<std::int64_t>(bytes));
  notify(EventKind::kSegmentAlloc, stream, ptr, bytes, bytes);
}

void Impl::note_device_error(Status error) {
  if (error == Status::kBackendError || error == Status::kDeinitialized) device_error = error;
}

void Impl::note_device_free(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) {
  reserved_now.store(segments.bytes(), std::memory_order_relaxed);
  ++stats.num_device_free;
  sub_stat(stats.reserved_bytes, kind, static_cast<std::int64_t>(bytes));
  notify(EventKind::kSegmentFree, stream, ptr, bytes, bytes);
}

Block* Impl::new_segment(StreamHandle stream, std::size_t rounded, PoolKind kind) {
  const std::size_t size = SizeClasses::segment_size(rounded);
  if (!claim(size)) return nullptr;
  DevicePtr base = 0;
  if (const Status st = backend.allocate_segment(size, &base); st != Status::kOk) {
    unclaim(size);
    note_device_error(st);
    return nullptr;
  }
  return add_segment(base, size, kind, stream)->first;
}

Segment* Impl::add_segment(DevicePtr base, std::size_t size, PoolKind kind, StreamHandle stream) {
  Segment* s = segments.add(base, size, kind, stream);
  add_stat(stats.segment, kind, 1);
  if (sizes.is_oversize(size)) ++stats.oversize_segments;
  note_device_alloc(kind, stream, base, size);
  return s;
}

bool Impl::free_segment(Segment* s) {
  const PoolKind kind = s->pool;
  const DevicePtr base = s->base;
  const std::size_t size = s->size;
  const StreamHandle stream = s->stream;
  blocks.erase(s->first);
  segments.remove(s);
  sub_stat(stats.segment, kind, 1);
  if (sizes.is_oversize(size)) --stats.oversize_segments;
  // Observers hear of it while the memory still exists (a sanitizer's heap is unregistered
  // before the driver takes the memory back).
  note_device_free(kind, stream, base, size);
  // The room under the limit is given back only once the device took the memory back: given
  // back before, another context of the device could claim it while the device still held
  // both, and for good if the device refused. A deferred free gives it back in freed_later
  // (counted first: that may run on another thread before free_segment returns here).
  freeing.fetch_add(size, std::memory_order_relaxed);
  const Status st = backend.free_segment(base, size);
  if (st == Status::kDeferred) return true;
  freeing.fetch_sub(size, std::memory_order_relaxed);
  if (st == Status::kOk) {
    unclaim(size);
    return true;
  }
  // The device still holds the memory, still claimed: it comes back as an idle segment of the
  // pool (observers hear of it again), else it would be held and counted by nobody.
  Segment* again = add_segment(base, size, kind, stream);
  --stats.num_device_alloc;  // neither call reached the device
  --stats.num_device_free;
  blocks.insert(again->first);
  return false;
}

void Impl::freed_later(std::size_t bytes) {
  freeing.fetch_sub(bytes, std::memory_order_relaxed);
  unclaim(bytes);
}

// Observers would otherwise never hear that this memory went: a sanitizer's NVTX heaps and
// regions stayed registered over addresses the driver may hand to someone else, and a trace
// showed the context's blocks live and its memory reserved for good. Each live block gets a
// free (as the program's own would read), before the end of the segment it lies in; then each
// segment, or each mapped chunk of an expandable one (as it was reported), a segment free.
void Impl::report_forgotten() {
  if (observer.load(std::memory_order_acquire) == nullptr) return;
  std::size_t reserved = segments.bytes();
  segments.for_each([&](Segment* s) {
    for (Block* b = s->first; b != nullptr; b = b->next) {
      if (b->state != BlockState::kAllocated) continue;
      count_allocated(-static_cast<std::int64_t>(b->size));
      notify(EventKind::kFree, b->stream, b->ptr, b->requested, b->size);
    }
    const auto gone = [&](DevicePtr ptr, std::size_t bytes) {
      reserved -= bytes;
      reserved_now.store(reserved, std::memory_order_relaxed);
      notify(EventKind::kSegmentFree, s->stream, ptr, bytes, bytes);
    };
    if (!s->expandable) {
      gone(s->base, s->size);
    } else {
      for (const auto& [ptr, bytes] : s->chunks) gone(ptr, bytes);
    }
  });
}

Block* Impl::obtain(StreamHandle stream, std::size_t rounded, PoolKind kind) {
  return options.expandable_segments ? expandable.grow(stream, rounded, kind) : new_segment(stream, rounded, kind);
}

}  // namespace cudalloc
