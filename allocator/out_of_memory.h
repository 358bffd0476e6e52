// What the allocator knows about running out: the reclaimer, the ladder's last resort (memory
// held elsewhere on the device, given back with none of this allocator's locks held); the
// device's refusal for a reason other than want of memory, which ends the ladder at once; and
// the report of the last request that failed. The ladder decides when each applies; this
// holds what they leave behind. Under the device lock, but the reclaimer (see set_reclaimer).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <utility>

#include "allocator/oom_report.h"
#include "allocator/size_classes.h"
#include "allocator/types.h"

namespace cudalloc {

class OutOfMemory {
 public:
  // Before the first allocation: afterwards it is read without the device lock.
  void set_reclaimer(std::function<bool()> reclaim) { reclaimer_ = std::move(reclaim); }
  // Whether a request of `bytes` that found no memory may try again after a reclaim. A request
  // no device could hold gains nothing from other contexts' caches.
  bool may_reclaim(std::size_t bytes) const { return reclaimer_ && bytes <= kMaxRoundable; }
  // Gives back memory held elsewhere on the device; whether it gave any. With no lock held.
  bool reclaim() const { return reclaimer_(); }

  // A new try of the ladder: no refusal yet.
  void start_try() { device_error_ = Status::kOk; }
  // The device refused memory with `error`. Only errors that releasing cache cannot help (a
  // capture that forbids the call, a broken context) end the ladder; the program then gets
  // that error, not an out-of-memory report.
  void note_device_error(Status error) {
    if (error == Status::kBackendError || error == Status::kDeinitialized) device_error_ = error;
  }
  bool device_refused() const { return device_error_ != Status::kOk; }
  Status device_error() const { return device_error_; }

  void record(OomReport report) { last_ = std::move(report); }
  const std::optional<OomReport>& last() const { return last_; }

 private:
  std::function<bool()> reclaimer_;  // empty: none
  Status device_error_ = Status::kOk;
  std::optional<OomReport> last_;
};

}  // namespace cudalloc
