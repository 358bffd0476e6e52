// Giving a block back to its allocator: the part shared by cuMemFree, cuMemFreeAsync and the
// end of a capture (frees that arrived during one were parked until then).
#pragma once

#include <vector>

#include "driver/cuda_api.h"
#include "shim/runtime.h"

namespace cudalloc::shim {

inline CUresult to_cuda(Status s) {
  switch (s) {
    case Status::kOk: return CUDA_SUCCESS;
    case Status::kInvalidValue: return CUDA_ERROR_INVALID_VALUE;
    case Status::kOutOfMemory: return CUDA_ERROR_OUT_OF_MEMORY;
    case Status::kDeinitialized: return CUDA_ERROR_DEINITIALIZED;
    case Status::kBackendError: return CUDA_ERROR_UNKNOWN;
    case Status::kDeferred: break;  // a backend's answer (backend.h), never the allocator's
  }
  return CUDA_ERROR_UNKNOWN;
}

// The order a free gives its block, outside captures and free_sync.
inline Status free_ordered(ProcessState& ps, ContextState& owner, DevicePtr p, bool async, StreamInfo* stream) {
  if (async) return owner.allocator.free(p, FreeOrder::kStream, key_of(stream), true);
  if (ps.single_stream.active()) {
    // Ordered on the legacy stream, where all the program's work runs (single_stream.h).
    return owner.allocator.free(p, FreeOrder::kStream, key_of(ps.streams.legacy()), false);
  }
  return owner.allocator.free(p, FreeOrder::kDevice);
}

// `ptr` lies in memory `owner` holds. async: cuMemFreeAsync on `stream`; else cuMemFree,
// host-blocking when `sync` (free_sync:true). Double and interior frees give
// CUDA_ERROR_INVALID_VALUE with a warning and leave the cache as it was.
CUresult free_owned(ProcessState& ps, ContextState& owner, CUdeviceptr ptr, bool async,
                    StreamInfo* stream, bool sync);

// The common free, with one live-map lookup instead of two: gives `ptr` back to the context
// where it is the start of a live block. False, with nothing done, during a capture or when no
// context has it live (a pointer of the driver's, or a double or interior free); the caller
// then goes through ContextRegistry::owner() and free_owned(). Callers keep free_sync frees,
// and frees on a stream that resolve() has just learnt, on that slow path themselves.
// Inline: it is the whole of a cached free's shim side.
inline bool free_live(ProcessState& ps, CUdeviceptr ptr, bool async, StreamInfo* stream, CUresult* result) {
  if (ps.captures.any()) return false;
  const auto p = static_cast<DevicePtr>(ptr);
  for (ContextState* s : ps.contexts.live()) {
    const Status st = free_ordered(ps, *s, p, async, stream);
    if (st != Status::kInvalidValue) [[likely]] {  // kInvalidValue: not a live block of this context
      *result = to_cuda(st);
      return true;
    }
  }
  return false;
}

// Runs frees parked during a capture that just ended; after the last one, also the segment
// frees cudalloc deferred meanwhile (DriverBackend::flush_deferred_frees).
void run_parked(ProcessState& ps, const std::vector<ParkedFree>& parked);

}  // namespace cudalloc::shim
