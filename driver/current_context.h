// Makes a context current for a scope when it is not already (fences and segments of one
// context may be handled from a thread whose current context is another one).
#pragma once

#include "driver/driver_api.h"

namespace cudalloc::shim {

class CurrentContext {
 public:
  explicit CurrentContext(CUcontext ctx) {
    const DriverApi& d = driver();
    CUcontext cur = nullptr;
    if (d.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != ctx && ctx != nullptr) {
      pushed_ = d.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
      failed_ = !pushed_;
    }
  }
  // False when `ctx` could not be made current (destroyed, say): calls in this scope would go
  // to whatever context is current instead.
  bool ok() const { return !failed_; }
  ~CurrentContext() {
    if (pushed_) {
      CUcontext popped = nullptr;
      driver().cuCtxPopCurrent_v2(&popped);
    }
  }
  CurrentContext(const CurrentContext&) = delete;
  CurrentContext& operator=(const CurrentContext&) = delete;

 private:
  bool pushed_ = false;
  bool failed_ = false;
};

}  // namespace cudalloc::shim
