#include "allocator/events.h"
#include "allocator/types.h"

namespace cudalloc {

const char* to_string(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kInvalidValue: return "invalid value";
    case Status::kOutOfMemory: return "out of memory";
    case Status::kBackendError: return "device error";
    case Status::kDeinitialized: return "driver deinitialized";
    case Status::kDeferred: return "deferred";
  }
  return "unknown";
}

const char* to_string(EventKind k) {
  switch (k) {
    case EventKind::kAlloc: return "alloc";
    case EventKind::kFree: return "free";
    case EventKind::kSegmentAlloc: return "segment_alloc";
    case EventKind::kSegmentFree: return "segment_free";
    case EventKind::kCacheRelease: return "cache_release";
    case EventKind::kOom: return "oom";
    case EventKind::kPassthroughAlloc: return "passthrough_alloc";
    case EventKind::kPassthroughFree: return "passthrough_free";
    case EventKind::kHostAlloc: return "host_alloc";
    case EventKind::kHostFree: return "host_free";
    case EventKind::kHostSegmentAlloc: return "host_segment_alloc";
    case EventKind::kHostSegmentFree: return "host_segment_free";
  }
  return "unknown";
}

}  // namespace cudalloc
