// Pinned host memory: cuMemHostAlloc and cuMemAllocHost_v2 (cudaHostAlloc, cudaMallocHost) are
// served from the host cache of the current context, cuMemFreeHost (cudaFreeHost) gives a block
// back to it; the queries about a pinned pointer answer for the block. Passthrough mode, flags
// cudalloc does not know, and pointers it does not own go to the driver. cuMemHostRegister
// (cudaHostRegister) is not intercepted: the program's own memory stays the program's.
#include "shim/hooks_host.h"

#include "driver/host_backend.h"
#include "shim/hooks.h"
#include "shim/runtime.h"
#include "support/log.h"

using namespace cudalloc;
using namespace cudalloc::shim;

namespace {

// The host cache that holds `p` and what it knows of it; kNotOwned (s null) when none does.
HostCache::Lookup find_host(ProcessState& ps, const void* p, HostBlockInfo* info, ContextState** owner = nullptr) {
  for (ContextState* s : ps.contexts.live()) {
    const HostCache::Lookup l = s->host.find(p, info);
    if (l == HostCache::Lookup::kNotOwned) continue;
    if (owner != nullptr) *owner = s;
    return l;
  }
  return HostCache::Lookup::kNotOwned;
}

CUDALLOC_NOINLINE CUresult host_refused(ContextState& s, std::size_t bytes, unsigned flags, Status st) {
  if (st == Status::kOutOfMemory) {
    const HostBudget& b = caching_state()->contexts.host_budget();
    if (b.limit() != 0) {
      log_error("cuMemHostAlloc(%zu bytes, flags 0x%x): out of pinned host memory: pinned_memory_limit_mb is %zu MiB, "
                "%zu bytes are pinned by cudalloc after its idle cached blocks were given back",
                bytes, flags, b.limit() >> 20, b.held());
    } else {
      log_error("cuMemHostAlloc(%zu bytes, flags 0x%x): the driver has no more pinned host memory, even after "
                "cudalloc gave back its idle cached blocks",
                bytes, flags);
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult r = DriverHostBackend::take_refusal();
  if (r == CUDA_SUCCESS) r = st == Status::kDeinitialized ? CUDA_ERROR_DEINITIALIZED : CUDA_ERROR_UNKNOWN;
  log_error("cuMemHostAlloc(%zu bytes, flags 0x%x) on device %d: the driver refused pinned memory (error %d)", bytes,
            flags, static_cast<int>(s.device), static_cast<int>(r));
  return r;
}

CUresult host_alloc(void** pp, std::size_t bytes, unsigned flags, bool alloc_host) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  auto real = [&] { return alloc_host ? d.cuMemAllocHost_v2(pp, bytes) : d.cuMemHostAlloc(pp, bytes, flags); };
  // Flags beyond the three cudalloc knows, sizes of 0 or beyond any class: the driver's answer.
  if (ps == nullptr || pp == nullptr || !HostCache::cacheable(bytes, flags)) return real();
  ContextState* s = ps->contexts.current();
  if (s == nullptr) return real();  // no context: the driver's own error
  void* p = nullptr;
  const Status st = s->host.allocate(bytes, flags, &p);
  if (st == Status::kOk) [[likely]] {
    *pp = p;
    return CUDA_SUCCESS;
  }
  return host_refused(*s, bytes, flags, st);
}

CUresult block_attribute(const HostBlockInfo& info, CUpointer_attribute attr, void* data, bool* done) {
  *done = true;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = reinterpret_cast<CUdeviceptr>(info.base);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = info.size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = info.buffer_id;
      return CUDA_SUCCESS;
    default:
      *done = false;
      return CUDA_SUCCESS;
  }
}

}  // namespace

bool cudalloc::shim::host_pointer_attribute(ProcessState& ps, void* data, CUpointer_attribute attr, CUdeviceptr ptr,
                                            CUresult* r) {
  HostBlockInfo info;
  const HostCache::Lookup l = find_host(ps, reinterpret_cast<const void*>(ptr), &info);
  if (l == HostCache::Lookup::kNotOwned) return false;
  // Freed memory inside a cached segment is, to the program, not memory the driver gave it.
  if (l == HostCache::Lookup::kFreed) {
    *r = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  bool done = false;
  *r = block_attribute(info, attr, data, &done);
  if (!done) *r = driver().cuPointerGetAttribute(data, attr, ptr);
  return true;
}

bool cudalloc::shim::host_pointer_attributes(ProcessState& ps, unsigned count, CUpointer_attribute* attrs,
                                             void** data, CUdeviceptr ptr, CUresult* r) {
  HostBlockInfo info;
  const HostCache::Lookup l = find_host(ps, reinterpret_cast<const void*>(ptr), &info);
  if (l == HostCache::Lookup::kNotOwned) return false;
  // Freed: the driver's answer for a pointer that is not CUDA memory, which it gives for null.
  *r = driver().cuPointerGetAttributes(count, attrs, data, l == HostCache::Lookup::kLive ? ptr : 0);
  if (*r != CUDA_SUCCESS || l != HostCache::Lookup::kLive) return true;
  for (unsigned i = 0; i < count; ++i) {
    bool done = false;
    if (data[i] != nullptr) block_attribute(info, attrs[i], data[i], &done);
  }
  return true;
}

bool cudalloc::shim::host_address_range(ProcessState& ps, CUdeviceptr* base, size_t* size, CUdeviceptr ptr,
                                        CUresult* r) {
  HostBlockInfo info;
  const HostCache::Lookup l = find_host(ps, reinterpret_cast<const void*>(ptr), &info);
  if (l == HostCache::Lookup::kNotOwned) return false;
  if (l == HostCache::Lookup::kFreed) {
    *r = CUDA_ERROR_NOT_FOUND;
    return true;
  }
  if (base != nullptr) *base = reinterpret_cast<CUdeviceptr>(info.base);
  if (size != nullptr) *size = info.size;
  *r = CUDA_SUCCESS;
  return true;
}

CUDALLOC_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  return host_alloc(pp, bytes, flags, false);
}

CUDALLOC_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytes) { return host_alloc(pp, bytes, 0, true); }

CUDALLOC_EXPORT CUresult cuMemFreeHost(void* p) {
  ProcessState* ps = caching_state();
  if (ps != nullptr && p != nullptr) {
    for (ContextState* s : ps->contexts.live()) {
      const HostCache::Lookup l = s->host.free(p);
      if (l == HostCache::Lookup::kLive) [[likely]] return CUDA_SUCCESS;
      if (l == HostCache::Lookup::kFreed) {
        log_error("cuMemFreeHost(%p): no live pinned block starts there (freed already, or a pointer inside a "
                  "block); nothing was freed",
                  p);
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
  }
  return driver().cuMemFreeHost(p);
}

// The segment was allocated with the block's flags (flag sets never share segments), so the
// driver's flags for the segment are the block's, including any it adds by itself.
CUDALLOC_EXPORT CUresult cuMemHostGetFlags(unsigned int* flags, void* p) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  HostBlockInfo info;
  const HostCache::Lookup l = ps == nullptr ? HostCache::Lookup::kNotOwned : find_host(*ps, p, &info);
  if (l == HostCache::Lookup::kNotOwned) return d.cuMemHostGetFlags(flags, p);
  if (l == HostCache::Lookup::kFreed || flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (d.cuMemHostGetFlags(flags, info.segment_base) != CUDA_SUCCESS) *flags = info.flags;
  return CUDA_SUCCESS;
}

// Asked for the segment's start and offset by hand: what the driver says of a pointer inside an
// allocation is not documented.
CUDALLOC_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned int flags) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  HostBlockInfo info;
  const HostCache::Lookup l = ps == nullptr ? HostCache::Lookup::kNotOwned : find_host(*ps, p, &info);
  if (l == HostCache::Lookup::kNotOwned) return d.cuMemHostGetDevicePointer_v2(dptr, p, flags);
  if (l == HostCache::Lookup::kFreed || dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr segment = 0;
  const CUresult r = d.cuMemHostGetDevicePointer_v2(&segment, info.segment_base, flags);
  if (r != CUDA_SUCCESS) return r;
  *dptr = segment + static_cast<CUdeviceptr>(static_cast<const char*>(p) - static_cast<const char*>(info.segment_base));
  return CUDA_SUCCESS;
}
