// When a free page of an expandable segment may be unmapped and mapped elsewhere (page
// stitching). Reuse in stream order lets a freed block serve the next request while the device
// still runs work queued before its free; moving its physical pages to another address would
// pull the memory from under that work. So every block entering a pool is stamped with the
// current era, an era is closed by a device fence, and a page may move only once the fence
// that closed its block's era has completed. Used under the device lock only.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>

#include "allocator/backend.h"

namespace cudalloc {

class UnmapClock {
 public:
  using Era = std::uint32_t;

  // The era a block freed now belongs to.
  Era now() const { return now_; }
  // Notes that a block was stamped with now(): the era needs a fence before it is safe.
  void stamped() { dirty_ = true; }
  // Learns which fences have completed, without waiting: one query per pending fence, so
  // callers ask once and then compare eras with safe().
  void collect() {
    while (!fences_.empty() && fences_.front().second->done()) {
      safe_ = fences_.front().first;
      fences_.pop_front();
    }
  }
  // Whether a block stamped `era` had no device work left on it at the last collect().
  bool safe(Era era) const { return era <= safe_; }
  // Closes the current era with a device fence, if anything was stamped in it.
  void close(SegmentBackend& backend) {
    if (!dirty_) return;
    fences_.emplace_back(now_, backend.record_device_fence());
    ++now_;
    dirty_ = false;
  }
  // Waits until `era` is safe, closing it first if it is the current one. False if the
  // device cannot be waited for now (a capture).
  bool wait(SegmentBackend& backend, Era era) {
    collect();
    if (safe(era)) return true;
    if (era >= now_) close(backend);
    while (!fences_.empty() && safe_ < era) {
      if (!fences_.front().second->wait()) return false;
      safe_ = fences_.front().first;
      fences_.pop_front();
    }
    return safe_ >= era;
  }
  // Every stamp so far is safe (the context's work is gone, or was waited for).
  void all_safe() {
    fences_.clear();
    safe_ = now_;
    ++now_;
    dirty_ = false;
  }

 private:
  Era now_ = 1;
  Era safe_ = 0;
  bool dirty_ = false;
  std::deque<std::pair<Era, std::unique_ptr<Fence>>> fences_;
};

}  // namespace cudalloc
