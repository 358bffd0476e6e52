#include "driver/vmm_cache.h"

#include <memory>
#include <vector>

#include "driver/all_contexts_fence.h"
#include "driver/driver_api.h"
#include "support/log.h"

namespace cudalloc::shim {

namespace {

VmAccess to_access(const CUmemAccessDesc& desc) {
  return VmAccess{(std::uint64_t{static_cast<std::uint32_t>(desc.location.type)} << 32) |
                      static_cast<std::uint32_t>(desc.location.id),
                  static_cast<std::uint64_t>(desc.flags)};
}

}  // namespace

// A refusal changes nothing the program could tell: it is logged, and the program's own call
// then gets the driver's answer.
void VmmCache::settle(const std::vector<VmOp>& ops) {
  const DriverApi& d = driver();
  for (const VmOp& op : ops) {
    CUresult r = CUDA_SUCCESS;
    switch (op.kind) {
      case VmOp::Kind::kUnmap:
        r = d.cuMemUnmap(op.address, op.size);
        break;
      case VmOp::Kind::kRelease:
        r = d.cuMemRelease(op.handle);
        break;
      case VmOp::Kind::kAddressFree:
        r = d.cuMemAddressFree(op.address, op.size);
        break;
    }
    if (r != CUDA_SUCCESS) {
      log_debug("virtual memory cache: giving back a pair (op %d, %#llx, %zu bytes) failed with error %d",
                static_cast<int>(op.kind), static_cast<unsigned long long>(op.address ? op.address : op.handle),
                op.size, static_cast<int>(r));
    }
  }
}

bool VmmCache::plain_create(size_t size, const CUmemAllocationProp* prop, unsigned long long flags) {
  if (prop == nullptr || flags != 0 || size == 0) return false;
  const auto& f = prop->allocFlags;
  bool reserved_zero = true;
  for (unsigned char b : f.reserved) reserved_zero = reserved_zero && b == 0;
  const bool handle_type = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE ||
                           prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop->type == CU_MEM_ALLOCATION_TYPE_PINNED && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
         prop->location.id >= 0 && prop->location.id < kMaxDevices && handle_type &&
         prop->win32HandleMetaData == nullptr && f.compressionType == 0 && f.gpuDirectRDMACapable <= 1 &&
         f.usage == 0 && reserved_zero;
}

int VmmCache::kind_of(const CUmemAllocationProp& prop) {
  return (prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ? 1 : 0) |
         (prop.allocFlags.gpuDirectRDMACapable != 0 ? 2 : 0);
}

bool VmmCache::plain_reserve(size_t size, CUdeviceptr addr, unsigned long long flags) {
  return size != 0 && addr == 0 && flags == 0;
}

VmmPairs& VmmCache::get(int device, int kind) {
  const int slot = device * kKinds + kind;
  if (VmmPairs* c = existing(slot)) [[likely]] return *c;
  std::lock_guard lock(make_mutex_);
  if (VmmPairs* c = existing(slot)) return *c;
  auto* c = new VmmPairs(device, [this] {
    auto fence = std::make_unique<AllContextsFence>();
    contexts_.record_device_fences(fence->parts);
    return std::unique_ptr<Fence>(std::move(fence));
  });
  devices_[slot].store(c, std::memory_order_release);
  if (count_.load(std::memory_order_relaxed) <= slot) count_.store(slot + 1, std::memory_order_release);
  return *c;
}

CUresult VmmCache::address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                   unsigned long long flags, int device) {
  const DriverApi& d = driver();
  if (ptr == nullptr || !plain_reserve(size, addr, flags) || device < 0 || device >= kMaxDevices) {
    return d.cuMemAddressReserve(ptr, size, alignment, addr, flags);
  }
  VmmPairs& c = get(device, last_kind_[device].load(std::memory_order_relaxed));
  if (auto base = c.lend_range(size, alignment)) {
    *ptr = static_cast<CUdeviceptr>(*base);
    return CUDA_SUCCESS;
  }
  const CUresult r = d.cuMemAddressReserve(ptr, size, alignment, addr, flags);
  if (r == CUDA_SUCCESS) c.note_reserved(*ptr, size);
  return r;
}

CUresult VmmCache::create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                          unsigned long long flags) {
  const DriverApi& d = driver();
  if (handle == nullptr || !plain_create(size, prop, flags)) return d.cuMemCreate(handle, size, prop, flags);
  const int dev = prop->location.id;
  const int kind = kind_of(*prop);
  last_kind_[dev].store(kind, std::memory_order_relaxed);
  VmmPairs& c = get(dev, kind);
  if (auto h = c.lend_handle(size)) {
    *handle = static_cast<CUmemGenericAllocationHandle>(*h);
    return CUDA_SUCCESS;
  }
  CUresult r = d.cuMemCreate(handle, size, prop, flags);
  if (r == CUDA_ERROR_OUT_OF_MEMORY && reclaim(dev)) r = d.cuMemCreate(handle, size, prop, flags);
  if (r == CUDA_SUCCESS) c.note_created(*handle, size);
  return r;
}

CUresult VmmCache::map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                       unsigned long long flags) {
  // A map with flags is not one a pair models (no offset fits): the pairs it touches are settled.
  const size_t modeled = flags == 0 ? offset : ~size_t{0};
  if (decide([&](VmmPairs& c) { return c.map(ptr, size, modeled, handle); })) return CUDA_SUCCESS;
  const CUresult r = driver().cuMemMap(ptr, size, offset, handle, flags);
  if (r == CUDA_SUCCESS) each([&](VmmPairs& c) { c.note_mapped(ptr, size, modeled, handle); });
  return r;
}

CUresult VmmCache::unmap(CUdeviceptr ptr, size_t size) {
  if (decide([&](VmmPairs& c) { return c.unmap(ptr, size); })) return CUDA_SUCCESS;
  return driver().cuMemUnmap(ptr, size);
}

CUresult VmmCache::release(CUmemGenericAllocationHandle handle) {
  if (decide([&](VmmPairs& c) { return c.release(handle); })) return CUDA_SUCCESS;
  return driver().cuMemRelease(handle);
}

CUresult VmmCache::address_free(CUdeviceptr ptr, size_t size) {
  if (decide([&](VmmPairs& c) { return c.address_free(ptr, size); })) return CUDA_SUCCESS;
  return driver().cuMemAddressFree(ptr, size);
}

CUresult VmmCache::retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr) {
  decide([&](VmmPairs& c) { return c.expose(reinterpret_cast<VmAddress>(addr)); });
  return driver().cuMemRetainAllocationHandle(handle, addr);
}

CUresult VmmCache::export_handle(void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                                 unsigned long long flags) {
  decide([&](VmmPairs& c) { return c.expose_handle(static_cast<VmHandle>(handle)); });
  return driver().cuMemExportToShareableHandle(shareable, handle, type, flags);
}

CUresult VmmCache::set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  std::vector<VmAccess> access;
  if (desc != nullptr) {
    access.reserve(count);
    for (size_t i = 0; i < count; ++i) access.push_back(to_access(desc[i]));
  }
  if (decide([&](VmmPairs& c) { return c.set_access(ptr, size, access); })) return CUDA_SUCCESS;
  const CUresult r = driver().cuMemSetAccess(ptr, size, desc, count);
  if (r == CUDA_SUCCESS) each([&](VmmPairs& c) { c.note_access(ptr, size, access); });
  return r;
}

std::size_t VmmCache::release_cached(int device) {
  std::size_t total = 0;
  each([&](VmmPairs& c) {
    if (device >= 0 && c.device() != device) return;
    std::size_t bytes = 0;
    settle(c.release_cached(&bytes));
    total += bytes;
  });
  return total;
}

bool VmmCache::reclaim(int device) {
  std::size_t released = release_cached(device);
  if (reclaimer_) released += reclaimer_(device);
  if (released != 0) {
    log_info("cuMemCreate out of memory on device %d: %zu cached bytes given back; retrying", device, released);
  }
  return released != 0;
}

std::string VmmCache::summary() const {
  std::string out;
  each([&](const VmmPairs& c) {
    if (c.used()) out += c.summary();
  });
  return out;
}

VmmStats VmmCache::stats(int device) const {
  VmmStats sum;
  for (int kind = 0; kind < kKinds; ++kind) {
    const VmmPairs* c = existing(device * kKinds + kind);
    if (c != nullptr) sum += c->stats();
  }
  return sum;
}

}  // namespace cudalloc::shim
