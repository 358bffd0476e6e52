#include "shim/sanitizer_nvtx.h"

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>

#include "support/log.h"

namespace cudalloc::shim {
namespace {

const void* as_pointer(DevicePtr p) { return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(p)); }

// One lock for everything: events come under the device lock and from the lock-free hot path
// of several threads, and each NVTX call must reach the tool in the order the cache changed.
class NvtxMemObserver final : public AllocatorObserver {
 public:
  void on_event(const AllocatorEvent& e) noexcept override {
    if (e.kind != EventKind::kSegmentAlloc && e.kind != EventKind::kSegmentFree && e.kind != EventKind::kAlloc &&
        e.kind != EventKind::kFree) {
      return;
    }
    if (e.result != Status::kOk || e.ptr == 0) return;
    std::lock_guard lock(mutex_);
    try {
      if (!domain_made_) {
        domain_ = nvtxDomainCreateA("cudalloc");  // null if the tool has no domains: still valid
        domain_made_ = true;
      }
      switch (e.kind) {
        case EventKind::kSegmentAlloc:
          // A context's end reports its heaps gone (forget_all); this only catches one whose
          // end was missed (an event dropped below for want of memory).
          drop_heaps(e.ptr, e.requested);
          heaps_[e.ptr] = Heap{e.requested, register_heap(e.ptr, e.requested)};
          break;
        case EventKind::kSegmentFree:
          drop_heaps(e.ptr, e.requested);
          break;
        case EventKind::kAlloc:
          on_alloc(e.ptr, e.requested);
          break;
        case EventKind::kFree:
          on_free(e.ptr);
          break;
        default:
          break;
      }
    } catch (...) {
      // Out of memory in a map: the registration is incomplete, the program goes on.
    }
  }

  void after_fork_child() {
    new (&mutex_) std::mutex;
    new (&heaps_) std::map<DevicePtr, Heap>;  // the old maps may be mid-change: leaked
    new (&regions_) std::map<DevicePtr, Region>;
  }

 private:
  struct Heap {
    std::size_t size;
    nvtxMemHeapHandle_t handle;  // null: no NVTX memory tool took it
  };
  struct Region {
    std::size_t requested = 0;
    // Allocations minus frees reported for this address. A hot-path free is reported after
    // its block is back in a thread cache, where another thread's drain can hand it out
    // again (whole, or coalesced into a new block) before the report: that late free must
    // not unregister the new owner's region.
    unsigned live = 0;
    bool registered = false;
  };

  nvtxMemHeapHandle_t register_heap(DevicePtr base, std::size_t size) {
    nvtxMemVirtualRangeDesc_t range{};
    range.ptr = as_pointer(base);
    range.size = size;
    nvtxMemHeapDesc_t desc{};
    desc.extCompatID = NVTX_EXT_COMPATID_MEM;
    desc.structSize = sizeof(desc);
    desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
    desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    desc.typeSpecificDescSize = sizeof(range);
    desc.typeSpecificDesc = &range;
    nvtxMemHeapHandle_t h = nvtxMemHeapRegister(domain_, &desc);
    if (h == nullptr && !warned_no_tool_) {
      warned_no_tool_ = true;
      log_warn("nvtx mode: no NVTX memory tool took the segment at 0x%llx; the sanitizer cannot see "
               "inside cached segments (use CUDALLOC_SANITIZER=passthrough)",
               static_cast<unsigned long long>(base));
    }
    return h;
  }

  // Unregisters and forgets every heap overlapping [base, base + size), and their regions.
  void drop_heaps(DevicePtr base, std::size_t size) {
    const DevicePtr end = base + size;
    auto it = heaps_.lower_bound(end);
    while (it != heaps_.begin()) {
      --it;
      const DevicePtr heap_end = it->first + it->second.size;
      if (heap_end <= base) break;
      // The tool drops a heap's regions with it.
      if (it->second.handle != nullptr) nvtxMemHeapUnregister(domain_, it->second.handle);
      regions_.erase(regions_.lower_bound(it->first), regions_.lower_bound(heap_end));
      it = heaps_.erase(it);
    }
  }

  const Heap* heap_containing(DevicePtr p, std::size_t bytes) const {
    auto it = heaps_.upper_bound(p);
    if (it == heaps_.begin()) return nullptr;
    --it;
    return p + bytes <= it->first + it->second.size ? &it->second : nullptr;
  }

  void on_alloc(DevicePtr ptr, std::size_t requested) {
    const Heap* heap = heap_containing(ptr, requested);
    if (heap == nullptr || heap->handle == nullptr) {
      if (heap == nullptr && !warned_no_heap_) {
        warned_no_heap_ = true;
        log_warn("nvtx mode: block 0x%llx lies in no registered segment; it is not registered",
                 static_cast<unsigned long long>(ptr));
      }
      return;
    }
    // Live blocks never overlap: a registered region overlapping this one is a freed block
    // whose free is still on its way. It is unregistered now; its entry absorbs the late free.
    auto it = regions_.lower_bound(ptr);
    for (auto back = it; back != regions_.begin();) {  // registered regions never overlap:
      --back;                                           // only the nearest one before can reach in
      if (!back->second.registered) continue;
      if (back->first + back->second.requested > ptr) stale(back->second, back->first);
      break;
    }
    for (; it != regions_.end() && it->first < ptr + requested; ++it) {
      if (it->first != ptr && it->second.registered) stale(it->second, it->first);
    }
    Region& r = regions_[ptr];
    if (r.registered) {  // handed out again before its free was reported
      log_debug("nvtx mode: 0x%llx handed out again before its free was reported",
                static_cast<unsigned long long>(ptr));
      unregister_region(ptr);
    }
    nvtxMemVirtualRangeDesc_t range{};
    range.ptr = as_pointer(ptr);
    range.size = requested;  // not the rounded size: a write past the request is an error
    nvtxMemRegionsRegisterBatch_t batch{};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof(batch);
    batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    batch.heap = heap->handle;
    batch.regionCount = 1;
    batch.regionDescElementSize = sizeof(range);
    batch.regionDescElements = &range;
    batch.regionHandleElementsOut = nullptr;
    nvtxMemRegionsRegister(domain_, &batch);
    r.requested = requested;
    r.registered = true;
    ++r.live;
  }

  void stale(Region& r, DevicePtr ptr) {
    log_debug("nvtx mode: 0x%llx overlaps a new block before its free was reported",
              static_cast<unsigned long long>(ptr));
    unregister_region(ptr);
    r.registered = false;
  }

  void on_free(DevicePtr ptr) {
    auto it = regions_.find(ptr);
    if (it == regions_.end()) return;
    if (--it->second.live > 0) return;  // a late free of an earlier owner
    if (it->second.registered) unregister_region(ptr);
    regions_.erase(it);
  }

  void unregister_region(DevicePtr ptr) {
    nvtxMemRegionRef_t ref{};
    ref.pointer = as_pointer(ptr);
    nvtxMemRegionsUnregisterBatch_t batch{};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof(batch);
    batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
    batch.refCount = 1;
    batch.refElementSize = sizeof(ref);
    batch.refElements = &ref;
    nvtxMemRegionsUnregister(domain_, &batch);
  }

  std::mutex mutex_;
  nvtxDomainHandle_t domain_ = nullptr;
  bool domain_made_ = false;
  std::map<DevicePtr, Heap> heaps_;  // by base
  std::map<DevicePtr, Region> regions_;
  bool warned_no_tool_ = false;
  bool warned_no_heap_ = false;
};

// Never destroyed: hooks run during exit too.
std::atomic<NvtxMemObserver*> g_observer{nullptr};

}  // namespace

void start_nvtx_registration() {
  if (g_observer.load(std::memory_order_acquire) == nullptr) {
    g_observer.store(new NvtxMemObserver, std::memory_order_release);
  }
}

AllocatorObserver* nvtx_observer() { return g_observer.load(std::memory_order_acquire); }

void nvtx_after_fork_child() {
  if (NvtxMemObserver* o = g_observer.load(std::memory_order_acquire)) o->after_fork_child();
}

}  // namespace cudalloc::shim
