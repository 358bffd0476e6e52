// Device fences shared by every thread's batches of cudaFree'd blocks.
//
// A batch is stamped with a ticket when it is closed. A device fence recorded afterwards covers
// every batch closed before it, whichever thread closed it, so threads need not each record
// their own: a thread closing a batch makes sure it is covered (cover()), and one whose
// bins run dry records a fence if none covers what it needs
// (passed()); either way the others find it. That keeps event records (which the driver
// serializes) few under many threads.
//
// Recording and querying are driver calls that cost far more than a cached pair: they run
// outside the spin lock, which only guards the bookkeeping. A ticket's stamp and the answer
// "already past" take no lock: under many threads of cudaMalloc pairs, spinning on this lock
// was most of what a thread-cache refill cost.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "allocator/backend.h"
#include "allocator/spin_lock.h"
#include "allocator/submission_watch.h"

namespace cudalloc {

class FenceClock {
 public:
  // A ticket for a batch closed now. (Acquire-release: a fence recorded once cover() has read
  // the ticket comes after the batch's frees.)
  std::uint64_t stamp() { return next_ticket_.fetch_add(1, std::memory_order_acq_rel); }

  // Whether every batch up to `ticket` is past its fence (or behind one that orders reuse,
  // backend.h). Records a device fence if none covering `ticket` exists yet. Never waits for the
  // device; it does wait for another thread that is recording or querying the fence that would
  // answer (one driver call, longer under many threads). Answering "not yet" instead sends the
  // caller's allocation to the device lock, where a small miss that finds nothing in the pools
  // drains the thread's cache, whose pipeline then fills again: under many threads of cudaMalloc
  // pairs that put thousands of allocations on the lock that the thread caches should serve.
  bool passed(std::uint64_t ticket, SegmentBackend& backend) {
    if (passed_now(ticket)) return true;
    wait_for_recording(ticket);  // its fence may cover `ticket`
    cover(ticket, backend);      // if not, one is recorded here
    return passed_now(ticket, /*wait=*/true);
  }

  // Waits until every batch up to `ticket` is past its fence, recording one if none covers it:
  // for a caller that holds all it may and would otherwise cut new memory. False when a fence
  // cannot be waited for now (a capture is on): the caller goes on without it. Waits as the
  // querying thread (querying_), so that no other thread queries the same fence meanwhile.
  bool wait_passed(std::uint64_t ticket, SegmentBackend& backend) {
    if (passed(ticket, backend)) return true;
    for (;;) {
      std::shared_ptr<Fence> oldest;
      std::uint64_t covers = 0;
      {
        std::lock_guard lock(lock_);
        if (known_past(ticket) || recorded_.empty()) return known_past(ticket);
        if (!querying_) {
          querying_ = true;
          oldest = recorded_.front().fence;
          covers = recorded_.front().covers;
        }
      }
      if (oldest == nullptr) {
        std::this_thread::yield();
        continue;
      }
      const bool waited = oldest->wait();
      std::lock_guard lock(lock_);
      querying_ = false;
      if (!waited) return false;
      // clear() may have run meanwhile: only retire what is still the oldest.
      if (!recorded_.empty() && recorded_.front().fence == oldest) {
        done_through_.store(std::max(done_through(), covers), std::memory_order_release);
        recorded_.pop_front();
      }
    }
  }

  // passed() for a caller that has something better to do than wait while another thread
  // records the fence that will cover `ticket`: kBusy then. (A recording is the long wait:
  // under many threads of cudaMalloc pairs, each on a stream of its own, fences are recorded
  // back to back, each a driver call per stream, and every thread needs the batch it has just
  // closed; waiting for them was a large share of those threads' time. A query of another
  // thread's is still waited for: one driver call.) kNotYet: the fence covering `ticket` is not
  // done.
  enum class Answer { kPassed, kNotYet, kBusy };
  Answer try_passed(std::uint64_t ticket, SegmentBackend& backend) {
    if (known_past(ticket)) return Answer::kPassed;
    cover(ticket, backend);  // records one here unless another thread is recording
    {
      std::lock_guard lock(lock_);
      // cover() asked that thread to go round once more for it; if it was in its last round,
      // the ticket stays uncovered and the next call records a fence here.
      if (!past_or_covered(ticket)) return Answer::kBusy;
    }
    return passed_now(ticket, /*wait=*/true) ? Answer::kPassed : Answer::kNotYet;
  }

  // Whether every batch up to `ticket` is known past its fence, recording nothing. With `wait`,
  // a query another thread is making is waited for, then the fences are queried here; without,
  // only what the others found so far counts.
  bool passed_now(std::uint64_t ticket, bool wait = false) {
    // Known already: no lock, and no query of a newer fence that this ticket does not need.
    if (known_past(ticket)) return true;
    retire_done(ticket, wait);
    return known_past(ticket);
  }

  // Makes sure a fence covering `ticket` is recorded (without waiting for it). A thread calls
  // it for the batch it just closed: by the time its bins run dry and it needs that batch, the
  // fence has had a batch's worth of pairs to complete. A fence recorded only when the bins are
  // already dry is seldom done at once, and the miss takes the device lock. While another
  // thread is recording, the ticket is left to it: that thread records once more before it
  // returns, covering every batch asked for meanwhile with one fence, and nobody waits. (Only
  // once more: under many threads batches close faster than fences record, and the recorder
  // has pairs of its own to serve. What is still uncovered then goes with the next cover(),
  // or with passed() when a thread needs it.)
  void cover(std::uint64_t ticket, SegmentBackend& backend) {
    {
      std::lock_guard lock(lock_);
      if (past_or_covered(ticket)) return;
      wanted_ = std::max(wanted_, ticket);
      if (recording_) return;
      recording_ = true;
    }
    for (int round = 0;; ++round) {
      // A ticket of the fence's own, stamped before the watch is cleared: a free that finds
      // the watch still clean is covered by this fence (submission_watch.h). A watch clean
      // already keeps its older ticket, which needs no newer fence: moved on at every fence, it
      // would stay ahead of what the refills have found passed.
      if (watch_ != nullptr && quiet_ticket() == 0) watch_->clear(slot_, stamp());
      // Every ticket stamped before this load: the fence recorded next covers it.
      const std::uint64_t want = next_ticket_.load(std::memory_order_acquire) - 1;
      auto fence = backend.record_device_fence();
      recorded_any_.store(true, std::memory_order_relaxed);
      std::lock_guard lock(lock_);
      recorded_.push_back(Recorded{want, std::shared_ptr<Fence>(std::move(fence))});
      covered_ = want;
      if (wanted_ <= covered_ || round == 1) {
        recording_ = false;
        return;
      }
    }
  }

  // Takes a slot of the backend's submission watch, if it has one. Before the first stamp.
  void attach(SegmentBackend& backend) {
    SubmissionWatch* w = backend.submission_watch();
    if (w == nullptr) return;
    slot_ = w->open_slot();
    if (slot_ != SubmissionWatch::kNoSlot) watch_ = w;
  }

  // Whether a cudaFree now may reuse its block at once: no device work was queued since a
  // fence of this clock began recording, and that fence has passed (submission_watch.h). No
  // lock, no call: two loads.
  bool quiet() const {
    const std::uint64_t ticket = quiet_ticket();
    return ticket != 0 && known_past(ticket);
  }

  // After a refill found its batch past: the fences up to the watch's quiet ticket are asked
  // too (no recording, no waiting), so that the frees stop waiting for fences as soon as the
  // device has caught up. A refill asks only for its own batch's, which lags behind the
  // quiet ticket by the batches still outstanding.
  void catch_up_quiet() {
    const std::uint64_t ticket = quiet_ticket();
    if (ticket != 0 && !known_past(ticket)) retire_done(ticket, /*wait=*/false);
  }

  // Whether this clock has recorded a fence yet; whether it has a watch (attach).
  bool recorded_any() const { return recorded_any_.load(std::memory_order_relaxed); }
  bool watched() const { return watch_ != nullptr; }

  void clear() {
    if (watch_ != nullptr) watch_->mark_dirty(slot_);
    std::lock_guard lock(lock_);
    recorded_.clear();
    covered_ = done_through();
    wanted_ = covered_;  // a recording in flight does not go round again for what was dropped
  }

 private:
  struct Recorded {
    std::uint64_t covers;  // every ticket up to this one
    std::shared_ptr<Fence> fence;
  };

  // The watch's quiet ticket for this clock (submission_watch.h); 0 without a watch.
  std::uint64_t quiet_ticket() const { return watch_ == nullptr ? 0 : watch_->quiet_since(slot_); }

  // While `ticket` is neither past nor covered and another thread is recording a fence.
  void wait_for_recording(std::uint64_t ticket) {
    for (;;) {
      {
        std::lock_guard lock(lock_);
        if (!recording_ || past_or_covered(ticket)) return;
      }
      std::this_thread::yield();
    }
  }

  bool known_past(std::uint64_t ticket) const {
    return ticket <= done_through_.load(std::memory_order_acquire);
  }

  // Fences complete in order of recording only per stream: they are checked oldest first, so
  // done_through_ only moves forward over completed fences, and only until `ticket` is past.
  // One thread queries at a time (querying_); the others read what it found, or with `wait`
  // wait for it and go on.
  void retire_done(std::uint64_t ticket, bool wait) {
    for (;;) {
      if (known_past(ticket)) return;
      std::shared_ptr<Fence> oldest;
      std::uint64_t covers = 0;
      bool busy = false;
      {
        std::lock_guard lock(lock_);
        if (recorded_.empty()) return;
        busy = querying_;
        if (!busy) {
          querying_ = true;
          oldest = recorded_.front().fence;
          covers = recorded_.front().covers;
        }
      }
      if (busy) {
        if (!wait) return;
        std::this_thread::yield();
        continue;
      }
      const bool done = reusable_after(*oldest);
      std::lock_guard lock(lock_);
      querying_ = false;
      if (!done) return;
      // clear() may have run meanwhile: only retire what is still the oldest.
      if (!recorded_.empty() && recorded_.front().fence == oldest) {
        done_through_.store(std::max(done_through(), covers), std::memory_order_release);
        recorded_.pop_front();
      }
    }
  }

  // Under lock_: nothing more to record for `ticket`.
  bool past_or_covered(std::uint64_t ticket) const { return ticket <= done_through() || covered_ >= ticket; }

  // Written under lock_ only.
  std::uint64_t done_through() const { return done_through_.load(std::memory_order_relaxed); }

  // Three lines: every thread stamps next_ticket_ when it closes a batch, reads done_through_
  // when it refills, and takes lock_ when it covers or queries; sharing a line, each of these
  // would miss after every other thread's.
  alignas(64) std::atomic<std::uint64_t> next_ticket_{1};
  alignas(64) std::atomic<std::uint64_t> done_through_{0};
  alignas(64) SpinLock lock_;
  std::uint64_t covered_ = 0;  // the newest ticket a recorded fence covers
  std::uint64_t wanted_ = 0;   // the newest ticket cover() was asked for
  bool recording_ = false;
  bool querying_ = false;
  std::atomic<bool> recorded_any_{false};
  // Set by attach(), then read only.
  SubmissionWatch* watch_ = nullptr;
  int slot_ = SubmissionWatch::kNoSlot;
  std::deque<Recorded> recorded_;
};

}  // namespace cudalloc
