// HostBackend over the real driver, for one context: the pinned memory of a context's host
// cache (allocator/host_cache.h) is allocated in that context and goes with it.
#pragma once

#include <memory>
#include <vector>

#include "allocator/host_cache.h"
#include "driver/capture.h"
#include "driver/cuda_api.h"

namespace cudalloc::shim {

// The process's live contexts (ContextRegistry), whose device fences a pinned block waits for.
// An interface, since the registry holds the contexts that hold these backends.
class LiveDeviceFences {
 public:
  // Appends a device fence recorded now in each live context.
  virtual void record_device_fences(std::vector<std::unique_ptr<Fence>>& out) = 0;

 protected:
  ~LiveDeviceFences() = default;
};

class DriverHostBackend final : public HostBackend {
 public:
  DriverHostBackend(CUcontext ctx, const CaptureTracker& captures, LiveDeviceFences& contexts)
      : ctx_(ctx), captures_(captures), contexts_(contexts) {}
  Status allocate(std::size_t bytes, unsigned flags, void** out) override;
  Status free(void* ptr) override;
  // A device fence in every live context: pinned memory is usable from every device (the
  // runtime and driver make it portable under unified addressing), and kernels may read mapped
  // memory directly, so no one stream's order covers it.
  std::unique_ptr<Fence> record_fence() override;
  // The driver's error behind this thread's last kBackendError (CUDA_SUCCESS if none), taken once.
  static CUresult take_refusal();

 private:
  CUcontext ctx_;
  const CaptureTracker& captures_;
  LiveDeviceFences& contexts_;
};

}  // namespace cudalloc::shim
