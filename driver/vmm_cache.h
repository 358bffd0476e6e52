// The program's own virtual-memory calls served from a cache of mapped pairs, one per device
// (allocator/vmm_pairs.h holds the policy). This is the part that talks to the driver: which
// requests are plain enough to serve, the real calls a decision needs, the retry after an
// out-of-memory.
//
// Plain requests only: cuMemCreate of pinned device memory with no shareable handle type, no
// compression, RDMA or usage flags and flags 0; cuMemAddressReserve at no fixed address with
// flags 0. Everything else (NCCL's buffers, which ask for shareable handles, among them) goes to
// the driver untouched, and a handle or range the cache does not know is never touched.
//
// Physical memory belongs to a device, address ranges to none: a handle is kept by the cache of
// its device, a range by the cache of the device current when it was reserved. The fences that
// gate reuse cover every live context, since access may have been granted to other devices.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "allocator/vmm_pairs.h"
#include "driver/cuda_api.h"
#include "driver/host_backend.h"

namespace cudalloc::shim {

class VmmCache {
 public:
  static constexpr int kMaxDevices = 64;
  // Requests a cache serves differ in their handle type (none, or POSIX file descriptors: XLA
  // asks for these) and in being RDMA-capable; each kind has its own pairs per device, so that
  // a handle is never lent to a request that asked for another kind.
  static constexpr int kKinds = 4;

  explicit VmmCache(LiveDeviceFences& contexts) : contexts_(contexts) {}
  VmmCache(const VmmCache&) = delete;
  VmmCache& operator=(const VmmCache&) = delete;

  // When a real cuMemCreate runs out of memory, after this cache's idle pairs of the device went
  // back: gives back the device's other idle caches (cudalloc's allocators); bytes released.
  // Set once, before the first call.
  void set_reclaimer(std::function<std::size_t(int device)> f) { reclaimer_ = std::move(f); }

  // The driver calls, with the driver's signatures and answers. `device`: that of the calling
  // thread's current context (-1: none), whose cache lends and keeps the range.
  CUresult address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags,
                           int device);
  CUresult address_free(CUdeviceptr ptr, size_t size);
  CUresult create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                  unsigned long long flags);
  CUresult release(CUmemGenericAllocationHandle handle);
  CUresult map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
               unsigned long long flags);
  CUresult unmap(CUdeviceptr ptr, size_t size);
  CUresult set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count);
  CUresult retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr);
  // An exported handle may be mapped by another process: it never becomes, or stays, a pair.
  CUresult export_handle(void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                         unsigned long long flags);

  // Whether cuMemCreate / cuMemAddressReserve with these arguments is one the cache serves.
  static bool plain_create(size_t size, const CUmemAllocationProp* prop, unsigned long long flags);
  // Which of the kKinds a served cuMemCreate is.
  static int kind_of(const CUmemAllocationProp& prop);
  static bool plain_reserve(size_t size, CUdeviceptr addr, unsigned long long flags);

  // Gives the cached pairs of `device` (every device: -1) back to the driver; bytes released.
  std::size_t release_cached(int device);
  // The CUDALLOC_STATS sections of the devices whose programs used virtual memory.
  std::string summary() const;
  VmmStats stats(int device) const;

 private:
  VmmPairs* existing(int slot) const {
    return slot >= 0 && slot < kMaxDevices * kKinds ? devices_[slot].load(std::memory_order_acquire) : nullptr;
  }
  VmmPairs& get(int device, int kind);
  // Calls `f` with each device's cache of each kind.
  template <typename F>
  void each(F&& f) const {
    const int n = count_.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
      if (VmmPairs* c = existing(i)) f(*c);
    }
  }
  // Asks every device's cache for its decision on a call (`call(cache)`), runs the real calls
  // they need, and says whether one served it. Only the cache that knows a range or handle acts.
  template <typename F>
  bool decide(F&& call) {
    std::vector<VmOp> ops;
    bool served = false;
    each([&](VmmPairs& c) {
      VmDecision dec = call(c);
      served = served || dec.served;
      ops.insert(ops.end(), dec.settle.begin(), dec.settle.end());
    });
    settle(ops);
    return served;
  }
  // The real calls that make the driver's state what the program believes.
  static void settle(const std::vector<VmOp>& ops);
  // Gives `device`'s idle memory back after an out-of-memory; whether any went.
  bool reclaim(int device);

  LiveDeviceFences& contexts_;
  std::function<std::size_t(int)> reclaimer_;
  std::mutex make_mutex_;
  // Slot device * kKinds + kind; never freed: hooks run at exit.
  std::array<std::atomic<VmmPairs*>, kMaxDevices * kKinds> devices_{};
  std::atomic<int> count_{0};  // one past the highest slot made
  // The kind of each device's last served cuMemCreate: a reserve, which names no kind, lends a
  // range of that kind's pairs (a program makes one kind of buffer, as XLA does).
  std::array<std::atomic<int>, kMaxDevices> last_kind_{};
};

}  // namespace cudalloc::shim
