// Stream captures in progress. While one is on, nothing may be recorded on or synchronize a
// capturing stream (that would invalidate the capture), and in global mode not even the
// legacy stream; so fences are deferred and frees parked until the last capture ends.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "driver/cuda_api.h"
#include "driver/streams.h"

namespace cudalloc::shim {

struct ContextState;

// A free that arrived while a capture was on.
struct ParkedFree {
  ContextState* owner = nullptr;
  CUdeviceptr ptr = 0;
  bool async = false;
  StreamInfo* stream = nullptr;  // async frees: the freeing stream
  bool in_graph = false;         // the freeing stream itself was being captured
};

// For a scope in which cudalloc asks the driver for memory (cuMemAlloc, cuMemAddressReserve,
// cuMemCreate/Map/SetAccess): while a capture is on, the calling thread's capture mode is
// relaxed. In global mode the driver fails those calls and invalidates the program's capture,
// though they touch no stream; a cache miss must not do what a hit does not. (PyTorch's
// allocator relaxes its cudaMalloc the same way.)
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(bool capturing);
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged_ = false;
};

class CaptureTracker {
 public:
  // Any capture on, anywhere in the process. One atomic load: the hot paths ask this.
  bool any() const { return active_.load(std::memory_order_acquire) > 0; }
  void begin(StreamInfo* s);
  // The parked frees to run now if this ended the last capture (else empty).
  std::vector<ParkedFree> end(StreamInfo* s);
  // Whether `s` is being captured. Asks the driver only while some capture is on; answers
  // true when it cannot tell (another thread's per-thread stream, a driver error).
  bool capturing(StreamInfo* s);
  // Parks `f` unless no capture is on any more (then false: free it now). `duplicate` is set
  // (and nothing parked) when the same pointer is already parked: a double free.
  bool park(const ParkedFree& f, bool* duplicate);
  // A context is gone: forgets its parked frees, and its streams' captures, which went with it.
  // Returns the parked frees to run now if that ended the last capture (else empty).
  std::vector<ParkedFree> drop_owner(ContextState* owner, CUcontext ctx);
  // Runs `f` unless a capture is on; no capture begins while it runs (begin() waits). For
  // driver calls that a capture beginning on another thread must not meet, such as a stream
  // query, which would invalidate it. False, without running `f`, while one is on.
  template <typename F>
  bool unless_capturing(F&& f) {
    std::lock_guard lock(mutex_);
    if (any()) return false;
    f();
    return true;
  }

 private:
  // Lines of their own: every cudaFree and async call reads active_, and every device fence
  // (each thread's; under many threads of cudaMalloc pairs, thousands a second) takes mutex_.
  // Sharing a line, every cached pair's read of active_ missed.
  alignas(64) std::atomic<int> active_{0};
  alignas(64) std::mutex mutex_;
  std::vector<StreamInfo*> capturing_;
  std::vector<ParkedFree> parked_;
};

}  // namespace cudalloc::shim
