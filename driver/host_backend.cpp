#include "driver/host_backend.h"

#include <utility>
#include <vector>

#include "driver/capture.h"
#include "driver/current_context.h"
#include "driver/driver_api.h"
#include "shim/runtime.h"

namespace cudalloc::shim {

namespace {

thread_local CUresult t_refusal = CUDA_SUCCESS;

// Done once every live context's device fence is.
class AllContextsFence final : public Fence {
 public:
  bool done() override {
    while (!parts.empty()) {
      if (!parts.back()->done()) return false;
      parts.pop_back();
    }
    return true;
  }
  bool wait() override {
    while (!parts.empty()) {
      if (!parts.back()->wait()) return false;
      parts.pop_back();
    }
    return true;
  }
  std::vector<std::unique_ptr<Fence>> parts;
};

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
  ProcessState* ps = detail::g_state.load(std::memory_order_acquire);
  RelaxedCaptureMode relaxed(ps != nullptr && ps->captures.any());
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
  // The state exists: a host cache belongs to one of its contexts. A fork child's fresh state
  // has no caches of the parent's.
  if (ProcessState* ps = detail::g_state.load(std::memory_order_acquire)) {
    for (ContextState* s : ps->contexts.live()) fence->parts.push_back(s->backend.record_device_fence());
  }
  return fence;
}

}  // namespace cudalloc::shim
