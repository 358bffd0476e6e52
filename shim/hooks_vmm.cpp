// The program's own virtual memory calls (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree), served from the cache of mapped
// pairs (driver/vmm_cache.h). cuMemRetainAllocationHandle hands out a real handle of a mapping
// the cache may hold, so the pair there goes back to the program's own state first; a handle
// cuMemExportToShareableHandle exports may be mapped by another process, so it never serves
// another request. Passthrough
// mode and the sanitizer's NVTX mode send every call to the driver: memcheck must see each of
// the program's allocations as the driver's.
#include "driver/vmm_cache.h"
#include "shim/hooks.h"
#include "shim/runtime.h"
#include "shim/sanitizer_nvtx.h"

using namespace cudalloc::shim;

namespace {

ProcessState* vmm_state() {
  ProcessState* ps = caching_state();
  return ps == nullptr || nvtx_observer() != nullptr ? nullptr : ps;
}

VmmCache* vmm_cache() {
  ProcessState* ps = vmm_state();
  return ps != nullptr ? &ps->vmm : nullptr;
}

// The calling thread's context, known to the registry from now on: the fences that gate a
// pair's reuse are recorded in the live contexts, and the program's work on this buffer runs
// in this one. Its device (-1: no context).
int current_device(ProcessState& ps) {
  ContextState* s = ps.contexts.current();
  return s != nullptr ? static_cast<int>(s->device) : -1;
}

}  // namespace

CUDALLOC_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                             unsigned long long flags) {
  if (ProcessState* ps = vmm_state()) {
    return ps->vmm.address_reserve(ptr, size, alignment, addr, flags, current_device(*ps));
  }
  return driver().cuMemAddressReserve(ptr, size, alignment, addr, flags);
}

CUDALLOC_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  if (VmmCache* c = vmm_cache()) return c->address_free(ptr, size);
  return driver().cuMemAddressFree(ptr, size);
}

CUDALLOC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  if (ProcessState* ps = vmm_state()) {
    current_device(*ps);
    return ps->vmm.create(handle, size, prop, flags);
  }
  return driver().cuMemCreate(handle, size, prop, flags);
}

CUDALLOC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (VmmCache* c = vmm_cache()) return c->release(handle);
  return driver().cuMemRelease(handle);
}

CUDALLOC_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                  unsigned long long flags) {
  if (VmmCache* c = vmm_cache()) return c->map(ptr, size, offset, handle, flags);
  return driver().cuMemMap(ptr, size, offset, handle, flags);
}

CUDALLOC_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  if (VmmCache* c = vmm_cache()) return c->unmap(ptr, size);
  return driver().cuMemUnmap(ptr, size);
}

CUDALLOC_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (VmmCache* c = vmm_cache()) return c->set_access(ptr, size, desc, count);
  return driver().cuMemSetAccess(ptr, size, desc, count);
}

CUDALLOC_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  if (VmmCache* c = vmm_cache()) return c->retain_allocation_handle(handle, addr);
  return driver().cuMemRetainAllocationHandle(handle, addr);
}

CUDALLOC_EXPORT CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                                      CUmemAllocationHandleType type, unsigned long long flags) {
  if (VmmCache* c = vmm_cache()) return c->export_handle(shareable, handle, type, flags);
  return driver().cuMemExportToShareableHandle(shareable, handle, type, flags);
}
