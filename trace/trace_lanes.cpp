#include "trace/trace_lanes.h"

#include <new>

namespace cudalloc {

TraceLane::TraceLane(std::size_t capacity, std::size_t stack_depth, std::size_t nvtx_bytes)
    : mask_(capacity - 1),
      stack_depth_(stack_depth),
      nvtx_bytes_(nvtx_bytes),
      records_(new TraceRecord[capacity]) {
  if (stack_depth > 0) pcs_.reset(new std::uintptr_t[capacity * stack_depth]);
  if (nvtx_bytes > 0) nvtx_.reset(new char[capacity * nvtx_bytes]);
}

void TraceLane::discard_all() noexcept {
  const std::uint64_t h = head_.load(std::memory_order_relaxed);
  head_local_ = h;
  tail_seen_ = h;
  tail_.store(h, std::memory_order_relaxed);
  dropped_.store(0, std::memory_order_relaxed);
  dropped_local_ = 0;
  dropped_reported_ = 0;
}

std::shared_ptr<TraceLane> LaneSet::acquire() noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& lane : owned_) {
      int expected = TraceLane::kFree;
      // Positions carry on from the previous owner's: nothing to reset.
      if (lane->state.compare_exchange_strong(expected, TraceLane::kOwned)) return lane;
    }
    const std::size_t n = count_.load(std::memory_order_relaxed);
    if (n == kMaxLanes) return nullptr;
    auto lane = std::make_shared<TraceLane>(capacity_, stack_depth_, nvtx_bytes_);
    owned_.push_back(lane);
    table_[n] = lane.get();
    count_.store(n + 1, std::memory_order_release);
    return lane;
  } catch (...) {  // std::bad_alloc, std::system_error
    return nullptr;
  }
}

}  // namespace cudalloc
