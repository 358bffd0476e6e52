// What the allocator tells an observer (the trace writer, statistics exporters).
// Observers are called on the allocating thread, sometimes under the device lock or a thread
// cache's lock: they must only copy the record somewhere and return, never call back in.
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocator/types.h"

namespace cudalloc {

enum class EventKind : std::uint8_t {
  kAlloc,             // a block handed to the program
  kFree,              // a block given back by the program
  kSegmentAlloc,      // a segment (or expandable-segment pages) obtained from the device
  kSegmentFree,       // a segment (or pages) given back to the device
  kCacheRelease,      // an explicit or pressure-driven release of cached memory finished
  kOom,               // an allocation failed after the whole ladder
  kPassthroughAlloc,  // no-caching mode: the device allocated directly
  kPassthroughFree,
  // Pinned host memory (allocator/host_cache.h); device -1, no stream.
  kHostAlloc,         // a host block handed to the program (hit: without a driver call)
  kHostFree,          // a host block given back by the program
  kHostSegmentAlloc,  // page-locked memory obtained from the driver
  kHostSegmentFree,   // page-locked memory given back to the driver
};

const char* to_string(EventKind k);

struct AllocatorEvent {
  EventKind kind;
  bool async = false;      // cudaMallocAsync / cudaFreeAsync
  bool cache_hit = false;  // kAlloc: served from cached memory without a device call
  // Every earlier event about this block was reported by this thread: a hit in the thread's own
  // cache (only its own frees fill it), or a free of a block it allocated. An observer that
  // orders records across threads by time need not fence this one against other threads'.
  bool local = false;
  Status result = Status::kOk;
  int device = 0;
  StreamHandle stream = 0;
  DevicePtr ptr = 0;
  std::size_t requested = 0;
  std::size_t rounded = 0;
  std::size_t allocated_after = 0;
  std::size_t reserved_after = 0;
};

class AllocatorObserver {
 public:
  virtual ~AllocatorObserver() = default;
  virtual void on_event(const AllocatorEvent& event) noexcept = 0;
};

}  // namespace cudalloc
