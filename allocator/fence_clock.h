// Device fences shared by every thread's batches of cudaFree'd blocks.
//
// A batch is stamped with a ticket when it is closed. A device fence recorded afterwards covers
// every batch closed before it, whichever thread closed it, so threads need not each record
// their own: the first one that needs a fence records one for all tickets issued so far, and
// the others find it. That keeps event records (which the driver serializes) few under many
// threads.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "allocator/backend.h"
#include "allocator/spin_lock.h"

namespace cudalloc {

class FenceClock {
 public:
  // A ticket for a batch closed now.
  std::uint64_t stamp() {
    std::lock_guard lock(lock_);
    return next_ticket_++;
  }

  // Whether every batch up to `ticket` is past its fence. Records a device fence if none
  // covering `ticket` exists yet. Non-blocking.
  bool passed(std::uint64_t ticket, SegmentBackend& backend) {
    std::lock_guard lock(lock_);
    if (ticket <= done_through_) return true;
    // Recorded fences cover increasing tickets: the newest tells whether any covers this one.
    if (recorded_.empty() || recorded_.back().covers < ticket) {
      recorded_.push_back(Recorded{next_ticket_ - 1, backend.record_device_fence()});
    }
    retire_done();
    return ticket <= done_through_;
  }

  // Makes sure a fence covering `ticket` is recorded (without waiting for it). A thread calls
  // it for an older batch when it closes a new one: by the time its bins run dry and it needs
  // that batch, the fence has had a few batches' worth of time to complete. A fence recorded
  // only when the bins are already dry is seldom done at once, and the miss takes the lock.
  void cover(std::uint64_t ticket, SegmentBackend& backend) {
    std::lock_guard lock(lock_);
    if (ticket <= done_through_ || (!recorded_.empty() && recorded_.back().covers >= ticket)) return;
    recorded_.push_back(Recorded{next_ticket_ - 1, backend.record_device_fence()});
  }

  void clear() {
    std::lock_guard lock(lock_);
    recorded_.clear();
  }

 private:
  // Fences complete in order of recording only per stream; check them oldest first and drop
  // the done ones, so done_through_ only moves forward over completed fences.
  void retire_done() {
    while (!recorded_.empty() && recorded_.front().fence->done()) {
      done_through_ = recorded_.front().covers;
      recorded_.pop_front();
    }
  }

  struct Recorded {
    std::uint64_t covers;  // every ticket up to this one
    std::unique_ptr<Fence> fence;
  };
  SpinLock lock_;
  std::uint64_t next_ticket_ = 1;
  std::uint64_t done_through_ = 0;
  std::deque<Recorded> recorded_;
};

}  // namespace cudalloc
