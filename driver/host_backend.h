// HostBackend over the real driver, for one context: the pinned memory of a context's host
// cache (allocator/host_cache.h) is allocated in that context and goes with it.
#pragma once

#include "allocator/host_cache.h"
#include "driver/cuda_api.h"

namespace cudalloc::shim {

class DriverHostBackend final : public HostBackend {
 public:
  explicit DriverHostBackend(CUcontext ctx) : ctx_(ctx) {}
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
};

}  // namespace cudalloc::shim
