// The steps the allocation ladder (device_allocator.cpp) takes when the pools cannot serve a
// request: garbage collection above the configured threshold, giving back oversize idle
// segments, adopting another stream's idle segment, releasing everything idle, and the report
// written when all of that fails. Each step is a policy on its own; keeping them here leaves
// the ladder itself short enough to read as the order in which they are tried.
#include <algorithm>
#include <limits>
#include <vector>

#include "allocator/device_allocator_impl.h"

namespace cudalloc {

using Impl = DeviceAllocator::Impl;

namespace {

template <typename Pred>
std::vector<Segment*> idle_segments(const SegmentTable& segments, Pred&& pred) {
  std::vector<Segment*> out;
  segments.for_each([&](Segment* s) {
    if (s->idle() && pred(s)) out.push_back(s);
  });
  return out;
}

}  // namespace

// Garbage collection: above the threshold, give back the longest-idle segments first.
void Impl::collect_garbage() {
  if (options.garbage_collection_threshold <= 0.0) return;
  const auto target =
      static_cast<std::size_t>(options.garbage_collection_threshold * static_cast<double>(memory_limit.in_force()));
  const std::size_t held = memory_limit.held();
  if (held <= target) return;
  // Small blocks parked in thread caches keep their segments busy: hand them back first.
  drain_all(Drain::kWithBins);
  // Only this allocator's memory can go: what the device holds above the target comes off it.
  const std::size_t mine = reserved();
  give_back_idle(held - target >= mine ? 0 : mine - (held - target));
}

// Idle plain segments, longest idle first, then the free chunks of expandable segments, until
// no more than `target` is reserved. The caller has drained the thread caches.
void Impl::give_back_idle(std::size_t target) {
  auto victims = idle_segments(segments, [](Segment*) { return true; });
  std::sort(victims.begin(), victims.end(),
            [](Segment* a, Segment* b) { return a->idle_since < b->idle_since; });
  for (Segment* s : victims) {
    if (reserved() <= target) break;
    free_segment(s);
  }
  if (reserved() > target) expandable.unmap_all_free_chunks(target);
}

// Oversize idle blocks go back first: the best fitting one, else the largest ones until
// enough is free.
bool Impl::release_oversize(std::size_t rounded) {
  if (options.max_split_size == std::numeric_limits<std::size_t>::max()) return false;
  auto victims = idle_segments(segments, [this](Segment* s) { return sizes.is_oversize(s->size); });
  if (victims.empty()) return false;
  std::sort(victims.begin(), victims.end(), [](Segment* a, Segment* b) { return a->size < b->size; });
  const std::size_t wanted = std::max(rounded, options.max_split_size);
  auto fit = std::find_if(victims.begin(), victims.end(), [&](Segment* s) { return s->size >= wanted; });
  if (fit != victims.end()) return free_segment(*fit);
  std::size_t released = 0;
  while (!victims.empty() && released < wanted) {
    const std::size_t size = victims.back()->size;
    if (free_segment(victims.back())) released += size;
    victims.pop_back();
  }
  return released > 0;
}

// A wholly idle segment of another stream can serve this one once that stream has passed
// the point of the free. A fence recorded now lies after the free, so its completion is
// enough; blocks from cudaFree (kNoStream) were device-fenced already.
Block* Impl::adopt_idle_segment(StreamHandle stream, std::size_t rounded, PoolKind kind) {
  Segment* best = nullptr;
  segments.for_each([&](Segment* s) {
    if (s->stream == stream || s->pool != kind || !s->idle()) return;
    if (s->size < rounded || !sizes.may_serve(s->size, rounded)) return;
    if (best == nullptr || s->size < best->size) best = s;
  });
  if (best == nullptr) return nullptr;
  if (best->stream != kNoStream && !backend.record_fence(best->stream)->done()) return nullptr;
  Block* b = best->first;
  blocks.erase(b);
  best->stream = stream;
  b->stream = stream;
  return b;
}

std::size_t Impl::release_idle(std::size_t keep) {
  take_back_refused();  // their free is tried again with the rest
  const std::size_t before = reserved();
  drain_all(Drain::kWithBins);
  wait_pending();
  give_back_idle(keep);
  const std::size_t released = before - reserved();
  events.notify({.kind = EventKind::kCacheRelease, .requested = released, .rounded = released});
  return released;
}

OomReport Impl::make_oom_report(std::size_t requested, std::size_t rounded, StreamHandle stream) {
  OomReport r;
  r.device = device;
  r.stream = stream;
  r.requested = requested;
  r.rounded = rounded;
  r.limit = memory_limit.in_force();
  r.device_total = backend.total_memory();
  r.allocated = stats.allocated();
  r.reserved = reserved();
  r.freeing = parked.freeing();
  const std::size_t held = memory_limit.held();
  r.held_elsewhere = held > r.reserved + r.freeing ? held - r.reserved - r.freeing : 0;
  r.largest_free_block = blocks.largest();
  r.pending_free = fences.pending_bytes();
  r.free_fragmented = blocks.bytes();
  return r;
}

}  // namespace cudalloc
