#include "driver/capture.h"

#include <algorithm>
#include <utility>

#include "driver/driver_api.h"

namespace cudalloc::shim {

RelaxedCaptureMode::RelaxedCaptureMode(bool capturing) {
  auto* exchange = driver().cuThreadExchangeStreamCaptureMode;
  if (!capturing || exchange == nullptr) return;
  exchanged_ = exchange(&mode_) == CUDA_SUCCESS;  // mode_ now holds the thread's own mode
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (exchanged_) driver().cuThreadExchangeStreamCaptureMode(&mode_);
}

void CaptureTracker::begin(StreamInfo* s) {
  std::lock_guard lock(mutex_);
  capturing_.push_back(s);
  active_.fetch_add(1, std::memory_order_acq_rel);
}

std::vector<ParkedFree> CaptureTracker::end(StreamInfo* s) {
  std::lock_guard lock(mutex_);
  auto it = std::find(capturing_.begin(), capturing_.end(), s);
  if (it == capturing_.end()) return {};  // a capture we did not see begin
  capturing_.erase(it);
  if (active_.fetch_sub(1, std::memory_order_acq_rel) != 1) return {};
  return std::exchange(parked_, {});
}

bool CaptureTracker::capturing(StreamInfo* s) {
  if (!any()) return false;
  {
    std::lock_guard lock(mutex_);
    if (std::find(capturing_.begin(), capturing_.end(), s) != capturing_.end()) return true;
  }
  CUstream h = nullptr;
  if (!driver_handle(s, &h)) return true;
  const DriverApi& d = driver();
  if (d.cuStreamIsCapturing == nullptr) return true;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d.cuStreamIsCapturing(h, &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

bool CaptureTracker::park(const ParkedFree& f, bool* duplicate) {
  *duplicate = false;
  std::lock_guard lock(mutex_);
  if (active_.load(std::memory_order_acquire) == 0) return false;
  for (const ParkedFree& p : parked_) {
    if (p.ptr == f.ptr && p.owner == f.owner) {
      *duplicate = true;
      return false;
    }
  }
  parked_.push_back(f);
  return true;
}

std::vector<ParkedFree> CaptureTracker::drop_owner(ContextState* owner, CUcontext ctx) {
  std::lock_guard lock(mutex_);
  std::erase_if(parked_, [owner](const ParkedFree& p) { return p.owner == owner; });
  // Left counted, they would park every free and defer every fence of every other context for
  // the rest of the process (cudaDeviceReset mid-capture is how a program recovers).
  const auto ended = static_cast<int>(std::erase_if(capturing_, [ctx](const StreamInfo* s) {
    return s->kind == StreamInfo::Kind::kCreated && s->ctx == ctx;
  }));
  if (ended == 0 || active_.fetch_sub(ended, std::memory_order_acq_rel) != ended) return {};
  return std::exchange(parked_, {});
}

}  // namespace cudalloc::shim
