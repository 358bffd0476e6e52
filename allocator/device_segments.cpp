// Getting memory from the device and giving it back: plain segments (one device allocation
// each, cut into blocks), the choice between them and expandable segments, and the ledger both
// report to (the limit, the reserved-bytes statistics, the observer's segment events). Kept
// apart from the allocation ladder, which only decides *when* to ask for memory.
#include "allocator/allocator_stats.h"
#include "allocator/device_allocator_impl.h"

namespace cudalloc {

using Impl = DeviceAllocator::Impl;

void Impl::note_device_alloc(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) {
  regions.add(ptr, bytes);
  events.set_reserved(segments.bytes());
  ++stats.totals.num_device_alloc;
  add_stat(stats.totals.reserved_bytes, kind, static_cast<std::int64_t>(bytes));
  events.notify_segment(EventKind::kSegmentAlloc, stream, ptr, bytes);
}

void Impl::note_device_free(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) {
  events.set_reserved(segments.bytes());
  ++stats.totals.num_device_free;
  sub_stat(stats.totals.reserved_bytes, kind, static_cast<std::int64_t>(bytes));
  events.notify_segment(EventKind::kSegmentFree, stream, ptr, bytes);
}

// Moved pages keep the memory held the same: the segment events tell observers that the
// addresses changed, the device calls are not counted (the growth that moved them is).
void Impl::note_pages_out(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) {
  events.set_reserved(segments.bytes());
  sub_stat(stats.totals.reserved_bytes, kind, static_cast<std::int64_t>(bytes));
  events.notify_segment(EventKind::kSegmentFree, stream, ptr, bytes);
}

void Impl::note_pages_in(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) {
  regions.add(ptr, bytes);
  events.set_reserved(segments.bytes());
  add_stat(stats.totals.reserved_bytes, kind, static_cast<std::int64_t>(bytes));
  events.notify_segment(EventKind::kSegmentAlloc, stream, ptr, bytes);
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
  add_stat(stats.totals.segment, kind, 1);
  if (sizes.is_oversize(size)) ++stats.totals.oversize_segments;
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
  sub_stat(stats.totals.segment, kind, 1);
  if (sizes.is_oversize(size)) --stats.totals.oversize_segments;
  // Observers hear of it while the memory still exists (a sanitizer's heap is unregistered
  // before the driver takes the memory back).
  note_device_free(kind, stream, base, size);
  // The room under the limit is given back only once the device took the memory back: given
  // back before, another context of the device could claim it while the device still held
  // both, and for good if the device refused. A deferred free gives it back in deferred_done
  // (counted and parked first: that may run on another thread before free_segment returns).
  parked.park(base, {size, kind, stream});
  const Status st = backend.free_segment(base, size);
  if (st == Status::kDeferred) return true;
  parked.unpark(base, size);
  if (st == Status::kOk) {
    unclaim(size);
    return true;
  }
  // The device still holds the memory, still claimed: it comes back as an idle segment of the
  // pool (observers hear of it again), else it would be held and counted by nobody.
  Segment* again = add_segment(base, size, kind, stream);
  --stats.totals.num_device_alloc;  // neither call reached the device
  --stats.totals.num_device_free;
  blocks.insert(again->first);
  return false;
}

void Impl::deferred_done(DevicePtr ptr, std::size_t bytes, bool freed) {
  if (parked.deferred_done(ptr, bytes, freed)) unclaim(bytes);
}

// As after a refused plain free (free_segment): an idle segment of its pool again, its room
// still claimed, given back at the next release. Under the lock.
void Impl::take_back_refused() {
  if (!parked.any_refused()) return;
  for (const auto& [base, p] : parked.take_refused()) {
    Segment* s = add_segment(base, p.size, p.kind, p.stream);
    --stats.totals.num_device_alloc;  // the memory never left: no new device allocation
    --stats.totals.num_device_free;   // and the free counted in free_segment did not happen
    blocks.insert(s->first);
  }
}

// Observers would otherwise never hear that this memory went: a sanitizer's NVTX heaps and
// regions stayed registered over addresses the driver may hand to someone else, and a trace
// showed the context's blocks live and its memory reserved for good. Each live block gets a
// free (as the program's own would read), before the end of the segment it lies in; then each
// segment, or each mapped chunk of an expandable one (as it was reported), a segment free.
void Impl::report_forgotten() {
  if (events.observer() == nullptr) return;
  std::size_t reserved = segments.bytes();
  segments.for_each([&](Segment* s) {
    for (Block* b = s->first; b != nullptr; b = b->next) {
      if (b->state != BlockState::kAllocated) continue;
      events.count_allocated(-static_cast<std::int64_t>(b->size));
      events.notify({.kind = EventKind::kFree, .stream = b->stream, .ptr = b->ptr, .requested = b->requested,
                     .rounded = b->size});
    }
    const auto gone = [&](DevicePtr ptr, std::size_t bytes) {
      reserved -= bytes;
      events.set_reserved(reserved);
      events.notify_segment(EventKind::kSegmentFree, s->stream, ptr, bytes);
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
