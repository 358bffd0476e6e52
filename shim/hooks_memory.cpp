// The memory calls: served from the caching allocator of the current context, or passed to
// the driver (passthrough mode, no context, pointers cudalloc does not own, graph memory).
#include <algorithm>
#include <limits>
#include <vector>

#include "driver/ipc_export.h"
#include "driver/ipc_import.h"
#include "shim/free_path.h"
#include "shim/hooks.h"
#include "shim/hooks_host.h"
#include "shim/runtime.h"
#include "shim/tracing.h"
#include "support/log.h"
#include "support/profile.h"

using namespace cudalloc;
using namespace cudalloc::shim;

namespace {

CUDALLOC_NOINLINE CUresult out_of_memory(ContextState& s, std::size_t bytes) {
  if (const auto report = s.allocator.last_oom()) {
    log_error("%s", report->message().c_str());
  } else {
    log_error("out of memory allocating %zu bytes on device %d", bytes, static_cast<int>(s.device));
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}

// New memory refused by the driver for another reason than its size: its own error.
CUDALLOC_NOINLINE CUresult refused(ContextState& s, std::size_t bytes, Status st) {
  CUresult r = DriverBackend::take_refusal();
  if (r == CUDA_SUCCESS) r = to_cuda(st);
  log_error("allocating %zu bytes on device %d: the driver refused new memory (error %d); nothing cached was "
            "released",
            bytes, static_cast<int>(s.device), static_cast<int>(r));
  return r;
}

// An allocation the allocator refused with `st` (after the idle caches of the device's other
// contexts were released and the request tried again: ContextRegistry::release_others): the
// driver's error, with the report for an out-of-memory.
CUDALLOC_NOINLINE CUresult allocate_refused(ContextState& s, std::size_t bytes, Status st) {
  if (st == Status::kOutOfMemory) return out_of_memory(s, bytes);
  if (st == Status::kBackendError) return refused(s, bytes, st);
  return to_cuda(st);
}

CUDALLOC_INLINE CUresult allocate(ContextState& s, CUdeviceptr* dptr, std::size_t bytes, StreamHandle stream, bool async) {
  DevicePtr p = 0;
  const Status st = s.allocator.allocate(bytes, stream, &p, async);
  if (st == Status::kOk) [[likely]] {
    *dptr = static_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
  }
  return allocate_refused(s, bytes, st);
}

// Each hook has a general path, which handles every case (passthrough, a thread's first call,
// a new stream or context, captures, single_stream, the profile), and a hot path in front of
// it for what a loop of cached pairs meets: a known context, a stream the thread already knows
// (StreamRegistry::known), nothing else to do (hot_state()). The hot paths call the allocator
// and, where no stream names the context (cudaMalloc, the default streams), the driver for the
// current one; whatever else they would need is the general path's.

CUDALLOC_NOINLINE CUresult mem_alloc_general(CUdeviceptr* dptr, std::size_t bytes) {
  profile::Scope timed(profile::Site::kMemAlloc);
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  if (ps == nullptr) {
    const CUresult r = d.cuMemAlloc_v2(dptr, bytes);
    trace_passthrough(EventKind::kPassthroughAlloc, r == CUDA_SUCCESS ? *dptr : 0, bytes, nullptr, false, r);
    return r;
  }
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;  // the driver's answers
  ContextState* s = ps->contexts.current();
  if (s == nullptr) return d.cuMemAlloc_v2(dptr, bytes);  // no context: the driver's own error
  // single_stream: the block belongs to the legacy stream, whose order makes its reuse safe.
  const StreamHandle stream = ps->single_stream.active() ? key_of(ps->streams.legacy()) : kNoStream;
  return allocate(*s, dptr, bytes, stream, false);
}

// A stream other than the legacy one ends single_stream; one met for the first time (made
// by a path cudalloc does not wrap) learns what the backend and single_stream need of it. A
// library's helper stream in a memory call is used beyond the fork and join that order it.
void stream_used_slow(ProcessState& ps, ContextState& s, StreamInfo* si, bool learnt) {
  if (learnt) s.backend.add_stream(si);
  if (si->helper.load(std::memory_order_relaxed)) s.backend.unmark_helper(si);
  if (si->kind != StreamInfo::Kind::kLegacy && (learnt || ps.single_stream.active())) {
    ps.single_stream.stream_seen(ps.contexts, s.backend, si, learnt ? "an unknown stream" : "a stream other than the legacy one");
  }
}
// Inline up to "nothing to do", the answer for a known stream once single_stream has ended.
CUDALLOC_INLINE void stream_used(ProcessState& ps, ContextState& s, StreamInfo* si, bool learnt) {
  if (learnt || si->helper.load(std::memory_order_relaxed) ||
      (si->kind != StreamInfo::Kind::kLegacy && ps.single_stream.active())) [[unlikely]] {
    stream_used_slow(ps, s, si, learnt);
  }
}

CUDALLOC_NOINLINE CUresult mem_alloc_async_general(CUdeviceptr* dptr, std::size_t bytes, CUstream stream, bool ptsz) {
  profile::Scope timed(profile::Site::kMemAllocAsync);
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  auto* real = ptsz ? d.cuMemAllocAsync_ptsz : d.cuMemAllocAsync;
  if (ps == nullptr) {
    const CUresult r = real(dptr, bytes, stream);
    trace_passthrough(EventKind::kPassthroughAlloc, r == CUDA_SUCCESS ? *dptr : 0, bytes, stream, true, r);
    return r;
  }
  if (dptr == nullptr || bytes == 0) return real(dptr, bytes, stream);
  bool learnt = false;
  StreamInfo* si = ps->streams.resolve(stream, ptsz, &learnt);
  // Under a green context the legacy stream is its own, and the per-thread one does not exist
  // (null: the driver's own error, which allocates nothing) (ContextRegistry::current).
  ContextState* s = si->kind == StreamInfo::Kind::kCreated ? ps->contexts.get(si->ctx) : ps->contexts.current(&si);
  if (s == nullptr || si == nullptr) return real(dptr, bytes, stream);
  stream_used(*ps, *s, si, learnt);
  // On a capturing stream the driver makes a graph memory node; that pointer is not ours.
  if (ps->captures.any() && ps->captures.capturing(si)) return real(dptr, bytes, stream);
  return allocate(*s, dptr, bytes, key_of(si), true);
}

// `tried`: the hot path found the pointer live in no context (free_live); it is not asked again.
CUDALLOC_NOINLINE CUresult mem_free_async_general(CUdeviceptr ptr, CUstream stream, bool ptsz, bool tried) {
  profile::Scope timed(profile::Site::kMemFreeAsync);
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  auto* real = ptsz ? d.cuMemFreeAsync_ptsz : d.cuMemFreeAsync;
  if (ps == nullptr) {
    const CUresult r = real(ptr, stream);
    if (ptr != 0) trace_passthrough(EventKind::kPassthroughFree, ptr, 0, stream, true, r);
    return r;
  }
  if (ptr == 0) return real(ptr, stream);
  bool learnt = false;
  StreamInfo* si = ps->contexts.default_of(ps->streams.resolve(stream, ptsz, &learnt));
  // The per-thread stream under a green context: the driver refuses the call, and so, without
  // freeing anything, does cudalloc.
  if (si == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = CUDA_SUCCESS;
  if (!tried && !learnt && !ps->single_stream.active() && free_live(*ps, ptr, true, si, &r)) return r;
  ContextState* owner = ps->contexts.owner(ptr);
  // A stream met for the first time is registered even when the pointer is the driver's:
  // resolve() has learnt it, and it would not be "new" again.
  if (learnt || (owner != nullptr && ps->single_stream.active())) {  // else nothing to do
    ContextState* sc = si->kind == StreamInfo::Kind::kCreated ? ps->contexts.get(si->ctx)
                       : owner != nullptr                     ? owner
                                                              : ps->contexts.current();
    if (sc != nullptr) stream_used(*ps, *sc, si, learnt);
  }
  if (owner == nullptr) return real(ptr, stream);  // the driver's (graph memory, its own pools)
  return free_owned(*ps, *owner, ptr, true, si, false);
}

// `tried`: as mem_free_async_general's.
CUDALLOC_NOINLINE CUresult mem_free_general(CUdeviceptr ptr, bool tried) {
  profile::Scope timed(profile::Site::kMemFree);
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  if (ps == nullptr) {
    const CUresult r = d.cuMemFree_v2(ptr);
    if (ptr != 0) trace_passthrough(EventKind::kPassthroughFree, ptr, 0, nullptr, false, r);
    return r;
  }
  if (ptr == 0) return CUDA_SUCCESS;  // cudaFree(NULL) reaches the driver and succeeds
  const bool sync = runtime().config.free_sync;
  CUresult r = CUDA_SUCCESS;
  if (!tried && !sync && free_live(*ps, ptr, false, nullptr, &r)) return r;
  ContextState* owner = ps->contexts.owner(ptr);
  if (owner == nullptr) return d.cuMemFree_v2(ptr);
  return free_owned(*ps, *owner, ptr, false, nullptr, sync);
}

CUDALLOC_HOT CUresult mem_alloc(CUdeviceptr* dptr, std::size_t bytes) {
  ProcessState* ps = hot_state();
  if (ps != nullptr && dptr != nullptr && bytes != 0) [[likely]] {
    if (ContextState* s = ps->contexts.current()) [[likely]] {
      const StreamHandle stream = ps->single_stream.active() ? key_of(ps->streams.legacy()) : kNoStream;
      return allocate(*s, dptr, bytes, stream, false);
    }
  }
  return mem_alloc_general(dptr, bytes);
}

CUDALLOC_HOT CUresult mem_alloc_async(CUdeviceptr* dptr, std::size_t bytes, CUstream stream, bool ptsz) {
  ProcessState* ps = hot_state();
  if (ps != nullptr && dptr != nullptr && bytes != 0 && !ps->captures.any() && !ps->single_stream.active()) [[likely]] {
    StreamInfo* si = ps->streams.known(stream, ptsz);
    if (si != nullptr && !si->helper.load(std::memory_order_relaxed)) [[likely]] {
      ContextState* s = si->kind == StreamInfo::Kind::kCreated ? ps->contexts.find(si->ctx) : ps->contexts.current(&si);
      if (s != nullptr && si != nullptr) [[likely]] return allocate(*s, dptr, bytes, key_of(si), true);
    }
  }
  return mem_alloc_async_general(dptr, bytes, stream, ptsz);
}

CUDALLOC_HOT CUresult mem_free_async(CUdeviceptr ptr, CUstream stream, bool ptsz) {
  ProcessState* ps = hot_state();
  if (ps != nullptr && ptr != 0 && !ps->single_stream.active()) [[likely]] {
    if (StreamInfo* si = ps->contexts.default_of(ps->streams.known(stream, ptsz))) [[likely]] {
      CUresult r = CUDA_SUCCESS;
      if (free_live(*ps, ptr, true, si, &r)) [[likely]] return r;
      if (!ps->captures.any()) return mem_free_async_general(ptr, stream, ptsz, true);
    }
  }
  return mem_free_async_general(ptr, stream, ptsz, false);
}

}  // namespace

CUDALLOC_EXPORT CUDALLOC_HOT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) { return mem_alloc(dptr, bytes); }

CUDALLOC_EXPORT CUDALLOC_HOT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  ProcessState* ps = hot_state();
  if (ps != nullptr && ptr != 0 && !free_sync_hot()) [[likely]] {
    CUresult r = CUDA_SUCCESS;
    if (free_live(*ps, ptr, false, nullptr, &r)) [[likely]] return r;
    if (!ps->captures.any()) return mem_free_general(ptr, true);
  }
  return mem_free_general(ptr, false);
}

CUDALLOC_EXPORT CUDALLOC_HOT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return mem_alloc_async(dptr, bytes, stream, false);
}
CUDALLOC_EXPORT CUDALLOC_HOT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return mem_alloc_async(dptr, bytes, stream, true);
}
CUDALLOC_EXPORT CUDALLOC_HOT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) { return mem_free_async(ptr, stream, false); }
CUDALLOC_EXPORT CUDALLOC_HOT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream stream) {
  return mem_free_async(ptr, stream, true);
}

// The driver's rules: element size 4, 8 or 16; rows padded to the pitch alignment (512 bytes
// on every current GPU); a size that overflows is an invalid value.
CUDALLOC_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                            unsigned int element_size) {
  ProcessState* ps = caching_state();
  if (ps == nullptr) return driver().cuMemAllocPitch_v2(dptr, pitch, width, height, element_size);
  if (dptr == nullptr || pitch == nullptr || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (element_size != 4 && element_size != 8 && element_size != 16) return CUDA_ERROR_INVALID_VALUE;
  constexpr std::size_t kPitchAlign = 512;
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  if (width > kMax - (kPitchAlign - 1)) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t row = (width + kPitchAlign - 1) / kPitchAlign * kPitchAlign;
  if (height > kMax / row) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = mem_alloc(dptr, row * height);
  if (r == CUDA_SUCCESS) *pitch = row;
  return r;
}

// Idle cached bytes are free memory as far as the program is concerned (those of every context
// on the device: the driver's figure is the device's); with a memory limit, the limit is the
// total.
CUDALLOC_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  ProcessState* ps = caching_state();
  const CUresult r = driver().cuMemGetInfo_v2(free_bytes, total_bytes);
  if (ps == nullptr || r != CUDA_SUCCESS || free_bytes == nullptr || total_bytes == nullptr) return r;
  ContextState* s = ps->contexts.current();
  if (s == nullptr) return r;
  // The limit, like the driver's figures, is the device's: every context of it counts.
  std::size_t device_cached = 0;
  for (ContextState* other : ps->contexts.live()) {
    if (other->device == s->device) device_cached += other->allocator.cached_bytes();
  }
  std::size_t free_now = *free_bytes + device_cached;
  const AllocatorOptions& o = runtime().config.allocator;
  // The last test: a limit set through the C API (cudalloc_set_memory_fraction).
  if (o.memory_limit_bytes != 0 || o.per_process_memory_fraction < 1.0 ||
      s->allocator.memory_limit() < *total_bytes) {
    // In use is what the device's budget holds, less what idle caches could give back: the
    // budget also counts segments given back during a capture whose cuMemFree still waits,
    // which no context reserves any more but no request can have either.
    const std::size_t held = s->allocator.budget_held();
    const std::size_t in_use = held > device_cached ? held - device_cached : 0;
    const std::size_t limit = s->allocator.memory_limit();
    free_now = std::min(free_now, limit > in_use ? limit - in_use : 0);
    *total_bytes = std::min(*total_bytes, limit);
  }
  *free_bytes = std::min(free_now, *total_bytes);
  return r;
}

// The block the program got, not the segment around it.
CUDALLOC_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  ProcessState* ps = caching_state();
  ContextState* owner = ps == nullptr ? nullptr : ps->contexts.owner(ptr);
  if (CUresult r = CUDA_SUCCESS; owner == nullptr && ps != nullptr && host_address_range(*ps, base, size, ptr, &r)) return r;
  if (owner == nullptr) return driver().cuMemGetAddressRange_v2(base, size, ptr);
  const auto info = owner->allocator.find(static_cast<DevicePtr>(ptr));
  if (!info) return CUDA_ERROR_NOT_FOUND;  // freed memory inside a cached segment
  if (base != nullptr) *base = static_cast<CUdeviceptr>(info->base);
  if (size != nullptr) *size = info->size;
  return CUDA_SUCCESS;
}

namespace {
// Fills an attribute of a cached block that is the block's, not its segment's (its range, its
// buffer id); false for any other attribute.
bool block_attribute(const AllocationInfo& info, CUpointer_attribute attr, void* data) {
  if (attr == CU_POINTER_ATTRIBUTE_BUFFER_ID) {
    *static_cast<unsigned long long*>(data) = info.buffer_id;
    return true;
  }
  if (attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
    *static_cast<CUdeviceptr*>(data) = static_cast<CUdeviceptr>(info.base);
    return true;
  }
  if (attr == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
    *static_cast<size_t*>(data) = info.size;
    return true;
  }
  return false;
}
}  // namespace

// Memory of a cached segment that no live block covers is, to the program, freed: not a valid
// pointer, whatever the driver knows of the segment around it.
CUDALLOC_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  if (ps == nullptr || data == nullptr) return d.cuPointerGetAttribute(data, attr, ptr);
  ContextState* owner = ps->contexts.owner(ptr);
  if (CUresult r = CUDA_SUCCESS; owner == nullptr && host_pointer_attribute(*ps, data, attr, ptr, &r)) return r;
  if (owner == nullptr) return d.cuPointerGetAttribute(data, attr, ptr);
  const auto info = owner->allocator.find(static_cast<DevicePtr>(ptr));
  if (!info) return CUDA_ERROR_INVALID_VALUE;
  if (block_attribute(*info, attr, data)) return CUDA_SUCCESS;
  return d.cuPointerGetAttribute(data, attr, ptr);
}

CUDALLOC_EXPORT CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attrs, void** data,
                                                CUdeviceptr ptr) {
  ProcessState* ps = caching_state();
  if (CUresult hr = CUDA_SUCCESS; ps != nullptr && attrs != nullptr && data != nullptr &&
                                  host_pointer_attributes(*ps, count, attrs, data, ptr, &hr)) {
    return hr;
  }
  const CUresult r = driver().cuPointerGetAttributes(count, attrs, data, ptr);
  if (ps == nullptr || r != CUDA_SUCCESS || attrs == nullptr || data == nullptr) return r;
  ContextState* owner = ps->contexts.owner(ptr);
  if (owner == nullptr) return r;
  const auto info = owner->allocator.find(static_cast<DevicePtr>(ptr));
  // Freed: the driver's answer for a pointer that is not CUDA memory (its defaults, not an
  // error), which it gives for null.
  if (!info) return driver().cuPointerGetAttributes(count, attrs, data, 0);
  for (unsigned i = 0; i < count; ++i) {
    if (data[i] != nullptr) block_attribute(*info, attrs[i], data[i]);
  }
  return r;
}

// A native handle names a whole driver allocation, and the receiver maps it at its start: the
// right memory only for a block that starts a plain segment. A block of an expandable segment
// lies in chunks no native handle names: cudalloc exports it itself (driver/ipc_export.h), and
// the importer, which must run cudalloc too, opens it (cuIpcOpenMemHandle below). A pointer
// inside a block names the whole block, as natively a pointer inside an allocation does. Any
// other block fails loudly rather than hand out a handle to the wrong bytes.
CUDALLOC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr ptr) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  ContextState* owner = ps == nullptr ? nullptr : ps->contexts.owner(ptr);
  if (owner == nullptr) return d.cuIpcGetMemHandle(handle, ptr);
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto info = owner->allocator.find(static_cast<DevicePtr>(ptr));
  if (!info) return CUDA_ERROR_INVALID_VALUE;
  std::vector<DriverBackend::MappedChunk> chunks;
  const bool in_chunks = owner->backend.describe_range(info->base, info->size, &chunks);
  if (!in_chunks && info->base != info->segment_base) {
    log_error("cuIpcGetMemHandle(0x%llx): this block lies inside a larger cached segment (at offset %zu) and an "
              "IPC handle would open at the segment's start, not at this block; IPC of sub-allocated blocks of "
              "plain segments is not supported. Run the exporting process with expandable_segments:true or "
              "CUDALLOC_NO_CACHING=1.",
              static_cast<unsigned long long>(ptr), static_cast<std::size_t>(info->base - info->segment_base));
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The block's last owner's work may still be queued: the importer is not ordered behind it.
  if (!owner->backend.settle_reuse()) {
    log_error("cuIpcGetMemHandle(0x%llx): a stream capture is on, and device work queued before it may still "
              "use this block's memory for its previous owner, and waiting for it now would break the capture; "
              "export the handle after the capture ends.",
              static_cast<unsigned long long>(ptr));
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (in_chunks) return ipc::export_block(*owner, *info, handle);
  return d.cuIpcGetMemHandle(handle, ptr);
}

// cudalloc's handles are opened here, whether this process caches or not; the driver's own
// go to the driver.
namespace {
CUresult ipc_open(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags, bool v2) {
  CUresult r = CUDA_SUCCESS;
  if (ipc::open_handle(handle, flags, dptr, &r)) return r;
  const DriverApi& d = driver();
  return v2 ? d.cuIpcOpenMemHandle_v2(dptr, handle, flags) : d.cuIpcOpenMemHandle(dptr, handle, flags);
}
}  // namespace

CUDALLOC_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  return ipc_open(dptr, handle, flags, false);
}
CUDALLOC_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  return ipc_open(dptr, handle, flags, true);
}

CUDALLOC_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
  CUresult r = CUDA_SUCCESS;
  if (ipc::close_handle(ptr, &r)) return r;
  return driver().cuIpcCloseMemHandle(ptr);
}

// cudaMemPoolTrimTo on a device's default or current pool: cudalloc serves that pool's
// allocations, so trimming it gives back cudalloc's idle memory on that device, down to
// `keep` bytes per context, and all the idle pinned host memory of those contexts. The driver's
// own pool (graph memory, passthrough) is trimmed too.
CUDALLOC_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  const CUresult r = d.cuMemPoolTrimTo(pool, keep);
  if (ps == nullptr || r != CUDA_SUCCESS) return r;
  for (ContextState* s : ps->contexts.live()) {
    CUmemoryPool served = nullptr;
    const bool default_pool = d.cuDeviceGetDefaultMemPool != nullptr &&
                              d.cuDeviceGetDefaultMemPool(&served, s->device) == CUDA_SUCCESS && served == pool;
    const bool current_pool = !default_pool && d.cuDeviceGetMemPool != nullptr &&
                              d.cuDeviceGetMemPool(&served, s->device) == CUDA_SUCCESS && served == pool;
    if (default_pool || current_pool) {
      s->allocator.release_cached(keep);
      s->host.release_cached(true);  // pinned memory: all that is idle (keep counts device bytes)
      ps->vmm.release_cached(static_cast<int>(s->device));  // the program's idle virtual memory
    }
  }
  return r;
}
