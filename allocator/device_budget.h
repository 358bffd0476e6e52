// The memory a process holds on one device, against its limit. Every allocator of the device
// shares one (a context made with cuCtxCreate beside the primary context has an allocator of
// its own), so that memory_limit_mb and per_process_memory_fraction bound the process, as
// PyTorch's names say, not each context. Touched only when a segment is taken from or given
// back to the device, next to a driver call.
#pragma once

#include <atomic>
#include <cstddef>

namespace cudalloc {

class DeviceBudget {
 public:
  // Takes `bytes` if the total stays within `limit`; false, taking nothing, otherwise. Checked
  // and taken at once, so that two allocators cannot both pass the limit's last room.
  bool claim(std::size_t bytes, std::size_t limit) {
    std::size_t held = held_.load(std::memory_order_relaxed);
    do {
      if (bytes > limit || held > limit - bytes) return false;
    } while (!held_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
    return true;
  }
  // Memory the device holds whatever the limit says (a segment it would not take back).
  void add(std::size_t bytes) { held_.fetch_add(bytes, std::memory_order_relaxed); }
  void release(std::size_t bytes) { held_.fetch_sub(bytes, std::memory_order_relaxed); }
  std::size_t held() const { return held_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> held_{0};
};

}  // namespace cudalloc
