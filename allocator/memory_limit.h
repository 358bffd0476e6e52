// How much device memory an allocator may hold: the limit in force (memory_limit_mb,
// per_process_memory_fraction of the device's total, or set_memory_limit's override) and the
// device's budget that every allocator of the device counts its segments against
// (device_budget.h). Kept apart from the ladder so that "is there room" has one answer, read
// by the ladder, the segment code and the out-of-memory report alike.
//
// Under the device lock, but claim() and unclaim(): a segment's room goes back when the device
// frees it, which the backend may report from any thread. The budget is replaced (share) only
// before the first allocation, so that those calls read it without the lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>

#include "allocator/backend.h"
#include "allocator/device_budget.h"
#include "allocator/options.h"

namespace cudalloc {

class MemoryLimit {
 public:
  MemoryLimit(const SegmentBackend& backend, const AllocatorOptions& options)
      : backend_(backend), options_(options) {}
  MemoryLimit(const MemoryLimit&) = delete;
  MemoryLimit& operator=(const MemoryLimit&) = delete;

  // The reservation limit: the override if set, else the configured one.
  std::size_t in_force() const {
    if (override_ != 0) return override_;
    const std::size_t total = backend_.total_memory();
    std::size_t limit = total;
    if (options_.per_process_memory_fraction < 1.0) {
      limit = static_cast<std::size_t>(static_cast<double>(total) * options_.per_process_memory_fraction);
    }
    if (options_.memory_limit_bytes != 0) limit = std::min(limit, options_.memory_limit_bytes);
    return limit;
  }
  void set_override(std::size_t bytes) { override_ = bytes; }  // 0: the configured limit again

  // Takes `bytes` of the device's budget if they fit under the limit; false, taking nothing,
  // otherwise (SegmentLedger::claim).
  bool claim(std::size_t bytes) { return budget_->claim(bytes, in_force()); }
  void unclaim(std::size_t bytes) { budget_->release(bytes); }

  // Whether `bytes` more can be reserved without passing the limit or the collection threshold
  // (both the device's, whichever allocator of it holds the memory).
  bool room_for(std::size_t bytes) const {
    std::size_t cap = in_force();
    if (options_.garbage_collection_threshold > 0.0) {
      cap = static_cast<std::size_t>(options_.garbage_collection_threshold * static_cast<double>(cap));
    }
    const std::size_t held = budget_->held();
    return bytes <= cap && held <= cap - bytes;
  }

  // What the device's budget holds: every allocator's reserved bytes, and segments given back
  // but not yet freed by the device.
  std::size_t held() const { return budget_->held(); }

  // Counts against `budget`, shared with the device's other allocators, from now on; what this
  // allocator holds moves with it.
  void share(std::shared_ptr<DeviceBudget> budget) {
    if (budget == nullptr || budget == budget_) return;
    budget->add(budget_->held());
    budget_ = std::move(budget);
  }

 private:
  const SegmentBackend& backend_;
  const AllocatorOptions& options_;
  std::size_t override_ = 0;
  // This allocator's alone unless shared.
  std::shared_ptr<DeviceBudget> budget_ = std::make_shared<DeviceBudget>();
};

}  // namespace cudalloc
