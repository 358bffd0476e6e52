// Giving a block back to its allocator: the part shared by cuMemFree, cuMemFreeAsync and the
// end of a capture (frees that arrived during one were parked until then).
#pragma once

#include <vector>

#include "shim/cuda_api.h"
#include "shim/runtime.h"

namespace cudalloc::shim {

CUresult to_cuda(Status s);

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
bool free_live(ProcessState& ps, CUdeviceptr ptr, bool async, StreamInfo* stream, CUresult* result);

// Runs frees parked during a capture that just ended.
void run_parked(ProcessState& ps, const std::vector<ParkedFree>& parked);

}  // namespace cudalloc::shim
