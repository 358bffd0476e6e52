#include "allocator/parked_segments.h"

#include <mutex>

namespace cudalloc {

void ParkedSegments::park(DevicePtr base, const Parked& s) {
  freeing_.fetch_add(s.size, std::memory_order_relaxed);
  std::lock_guard lock(lock_);
  parked_[base] = Entry{s};
}

void ParkedSegments::unpark(DevicePtr base, std::size_t size) {
  {
    std::lock_guard lock(lock_);
    parked_.erase(base);
  }
  freeing_.fetch_sub(size, std::memory_order_relaxed);
}

bool ParkedSegments::deferred_done(DevicePtr base, std::size_t size, bool freed) {
  {
    std::lock_guard lock(lock_);
    const auto it = parked_.find(base);
    if (!freed && it != parked_.end()) {
      // Still the device's, and still claimed: the next locked step takes it back (this may
      // run under the device lock, or on a thread that must not wait for it).
      it->second.refused = true;
      any_refused_.store(true, std::memory_order_release);
      return false;
    }
    if (it != parked_.end()) parked_.erase(it);
  }
  if (!freed) return false;  // not one of ours: nothing to give back
  freeing_.fetch_sub(size, std::memory_order_relaxed);
  return true;
}

std::vector<std::pair<DevicePtr, ParkedSegments::Parked>> ParkedSegments::take_refused() {
  std::vector<std::pair<DevicePtr, Parked>> back;
  {
    std::lock_guard lock(lock_);
    any_refused_.store(false, std::memory_order_relaxed);
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (it->second.refused) {
        back.emplace_back(it->first, it->second.segment);
        it = parked_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& [base, s] : back) freeing_.fetch_sub(s.size, std::memory_order_relaxed);
  return back;
}

}  // namespace cudalloc
