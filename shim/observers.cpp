#include "shim/observers.h"

#include "shim/sanitizer_nvtx.h"
#include "shim/tracing.h"

namespace cudalloc::shim {
namespace {

// An allocator takes one observer; this one passes each event to two.
class FanOut final : public AllocatorObserver {
 public:
  FanOut(AllocatorObserver* a, AllocatorObserver* b) : a_(a), b_(b) {}
  void on_event(const AllocatorEvent& e) noexcept override {
    a_->on_event(e);
    b_->on_event(e);
  }

 private:
  AllocatorObserver* a_;
  AllocatorObserver* b_;
};

}  // namespace

AllocatorObserver* allocator_observer() {
  AllocatorObserver* trace = trace_observer();
  AllocatorObserver* nvtx = nvtx_observer();
  if (trace == nullptr || nvtx == nullptr) return trace != nullptr ? trace : nvtx;
  // Never destroyed: hooks run during exit too. Both observers live as long as the process.
  static FanOut* both = new FanOut(nvtx, trace);
  return both;
}

}  // namespace cudalloc::shim
