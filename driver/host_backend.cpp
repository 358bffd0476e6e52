#include "driver/host_backend.h"

#include <utility>
#include <vector>

#include "driver/all_contexts_fence.h"
#include "driver/current_context.h"
#include "driver/driver_api.h"

namespace cudalloc::shim {

namespace {

thread_local CUresult t_refusal = CUDA_SUCCESS;

}  // namespace

CUresult DriverHostBackend::take_refusal() { return std::exchange(t_refusal, CUDA_SUCCESS); }

Status DriverHostBackend::allocate(std::size_t bytes, unsigned flags, void** out) {
  CurrentContext current(ctx_);
  if (!current.ok()) {
    t_refusal = CUDA_ERROR_INVALID_CONTEXT;
    return Status::kBackendError;
  }
  // A miss must not do what a hit does not: in a global-mode capture the driver would fail the
  // call and invalidate the program's capture (as for device segments: capture.h).
  RelaxedCaptureMode relaxed(captures_.any());
  const CUresult r = driver().cuMemHostAlloc(out, bytes, flags);
  if (r == CUDA_SUCCESS) return Status::kOk;
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return Status::kOutOfMemory;
  t_refusal = r;
  return r == CUDA_ERROR_DEINITIALIZED ? Status::kDeinitialized : Status::kBackendError;
}

Status DriverHostBackend::free(void* ptr) {
  CurrentContext current(ctx_);
  const CUresult r = driver().cuMemFreeHost(ptr);
  return r == CUDA_SUCCESS ? Status::kOk : r == CUDA_ERROR_DEINITIALIZED ? Status::kDeinitialized : Status::kBackendError;
}

std::unique_ptr<Fence> DriverHostBackend::record_fence() {
  auto fence = std::make_unique<AllContextsFence>();
  // The contexts of this backend's own registry: a fork child's fresh state has other contexts,
  // but no caches of the parent's either.
  contexts_.record_device_fences(fence->parts);
  return fence;
}

}  // namespace cudalloc::shim
