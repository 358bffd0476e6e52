// Plain segments the backend frees later (Status::kDeferred, during a stream capture): from the
// moment their free is asked of the device until the backend reports that the device took the
// memory back, or refused it. Their room under the limit stays claimed meanwhile, so that
// another context of the device cannot claim memory the device still holds. A refused one is
// remembered with what it takes to put it back in its pool (take_refused).
//
// It has its own spin lock, taken last (after the device lock and a thread cache's): the
// backend reports from any thread, maybe one holding the device lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "allocator/memory_stats.h"
#include "allocator/spin_lock.h"
#include "allocator/types.h"

namespace cudalloc {

class ParkedSegments {
 public:
  // What it takes to enter a segment again as an idle segment of its pool.
  struct Parked {
    std::size_t size = 0;
    PoolKind kind = PoolKind::kSmall;
    StreamHandle stream = 0;
  };

  // A segment at `base` is about to be given back to the device. Parked before the backend is
  // asked: a deferred free may be reported on another thread before that call returns.
  void park(DevicePtr base, const Parked& s);
  // The device answered the free at once (done, or refused): the segment is parked no more.
  void unpark(DevicePtr base, std::size_t size);
  // The backend's later report on a deferred free. True when the device freed the memory, whose
  // room the caller then gives back to the budget; a refused segment stays parked, marked for
  // take_refused. Takes only the parking lock.
  bool deferred_done(DevicePtr base, std::size_t size, bool freed);
  // Whether the device refused a deferred free since the last take_refused: one load, since
  // every locked allocation asks.
  bool any_refused() const { return any_refused_.load(std::memory_order_acquire); }
  // The segments whose deferred free the device refused, parked no more.
  std::vector<std::pair<DevicePtr, Parked>> take_refused();
  // Bytes given back to the device but not freed by it yet.
  std::size_t freeing() const { return freeing_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    Parked segment;
    bool refused = false;  // the device refused the free: take_refused's
  };
  SpinLock lock_;
  std::map<DevicePtr, Entry> parked_;
  std::atomic<bool> any_refused_{false};
  std::atomic<std::size_t> freeing_{0};
};

}  // namespace cudalloc
