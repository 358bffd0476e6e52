// One caching allocator per CUDA context, so a device's blocks never serve another device
// and a context that goes away (cuCtxDestroy, cudaDeviceReset) takes only its own blocks.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "allocator/device_allocator.h"
#include "shim/capture.h"
#include "shim/cuda_api.h"
#include "shim/driver_backend.h"
#include "shim/single_stream.h"

namespace cudalloc::shim {

struct ContextState {
  ContextState(CUcontext ctx, CUdevice device, const AllocatorOptions& options, CaptureTracker& captures);
  CUcontext ctx;
  CUdevice device;
  DriverBackend backend;
  DeviceAllocator allocator;
};

class ContextRegistry {
 public:
  ContextRegistry(const AllocatorOptions& options, CaptureTracker& captures, SingleStreamMode& single_stream)
      : options_(options), captures_(captures), single_stream_(single_stream) {}

  // The state of the calling thread's current context; null when there is none.
  ContextState* current();
  // The state of `ctx`, made if needed (the context need not be current).
  ContextState* get(CUcontext ctx) {
    if (ContextState* s = find(ctx)) return s;
    return ctx == nullptr ? nullptr : make(ctx);
  }
  ContextState* find(CUcontext ctx) const {
    for (ContextState* s : live()) {
      if (s->ctx == ctx) return s;
    }
    return nullptr;
  }
  // The state whose allocator holds `p` (live, free or pending); null if none.
  ContextState* owner(CUdeviceptr p) const;
  // The live states (a snapshot: safe to use while others change the registry).
  const std::vector<ContextState*>& live() const { return *snapshot_.load(std::memory_order_acquire); }
  bool is_live(const ContextState* s) const;
  // The context is gone: forget its blocks without touching the device, never use it again.
  void drop(CUcontext ctx);

 private:
  ContextState* make(CUcontext ctx);  // get() of a context met for the first time

  const AllocatorOptions& options_;
  CaptureTracker& captures_;
  SingleStreamMode& single_stream_;  // ends when a second context is in use
  std::mutex mutex_;  // writers
  // Replaced, never modified, on a change; old snapshots are leaked (contexts are few).
  std::atomic<const std::vector<ContextState*>*> snapshot_{new std::vector<ContextState*>};
};

}  // namespace cudalloc::shim
