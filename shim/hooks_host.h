// What the pointer queries of hooks_memory.cpp ask of the host caches: a pointer into a cached
// pinned segment is answered for its block, not for the driver allocation around it.
#pragma once

#include "driver/cuda_api.h"

namespace cudalloc::shim {

struct ProcessState;

// Each returns false when no host cache holds `ptr` (the caller asks the driver); else true,
// with the answer in *r. Cheap while no host memory is cached.
bool host_pointer_attribute(ProcessState& ps, void* data, CUpointer_attribute attr, CUdeviceptr ptr, CUresult* r);
bool host_pointer_attributes(ProcessState& ps, unsigned count, CUpointer_attribute* attrs, void** data,
                             CUdeviceptr ptr, CUresult* r);
bool host_address_range(ProcessState& ps, CUdeviceptr* base, size_t* size, CUdeviceptr ptr, CUresult* r);

}  // namespace cudalloc::shim
