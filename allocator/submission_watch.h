// Whether the program has queued device work since a device fence: the watch behind reusing a
// cudaFree'd block at once.
//
// A cudaFree'd block may be reused once every piece of work queued before its free has run: a
// device fence recorded after the free says so. But if no work at all was queued between a
// device fence and the free, the work that used the block was all queued before that fence,
// and the block is reusable as soon as that fence has passed, with no fence of its own. A loop
// of allocations and frees with no kernel between them (setup code, a host-side pass over
// buffers, a benchmark) then makes no driver call at all.
//
// The shim's hooks of every driver call that queues work (launches, copies, sets, memory
// operations, graph launches: shim/hooks_submit.cpp) call note() after the call. Each fence
// clock owns a slot: clean(ticket) says that nothing was noted since the clock's fence for
// `ticket` began recording. A program that resolves a work-queueing entry point cudalloc does
// not hook makes the watch blind: every slot stays dirty from then on.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

namespace cudalloc {

class SubmissionWatch {
 public:
  static constexpr int kSlots = 64;
  static constexpr int kNoSlot = -1;

  // A slot for one fence clock; kNoSlot when all are taken (that clock goes without).
  int open_slot() {
    const int s = used_.fetch_add(1, std::memory_order_acq_rel);
    if (s >= kSlots) {
      used_.store(kSlots, std::memory_order_relaxed);
      return kNoSlot;
    }
    return s;
  }

  // After a call that queued device work returned. The full fence orders the work's queueing
  // before the loads below; a slot already dirty is not written, so threads launching kernels
  // share the slots' lines rather than bounce them.
  void note() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const int n = std::min(used_.load(std::memory_order_acquire), kSlots);
    for (int i = 0; i < n; ++i) {
      std::atomic<std::uint64_t>& s = slots_[i].state;
      if ((s.load(std::memory_order_relaxed) & kDirty) == 0) s.fetch_or(kDirty, std::memory_order_acq_rel);
    }
  }

  // Before the fence for `ticket` is recorded: nothing noted from here on is in the slot.
  // (An exchange, not a store: it reads the notes before it, so their work was queued before
  // the fence that follows.)
  void clear(int slot, std::uint64_t ticket) {
    if (slot == kNoSlot) return;
    slots_[slot].state.exchange(ticket << 1, std::memory_order_acq_rel);
    // A watch gone blind meanwhile: the entry point it could not see was resolved only now, so
    // nothing went through it before; dirty again before anything does.
    if (blind_.load(std::memory_order_seq_cst)) mark_dirty(slot);
  }

  // The ticket whose fence began recording after the last work queued, or 0 when work was
  // queued since (or nothing is known). One load: the cudaFree hot path asks.
  std::uint64_t quiet_since(int slot) const {
    if (slot == kNoSlot) return 0;
    const std::uint64_t s = slots_[slot].state.load(std::memory_order_acquire);
    return (s & kDirty) != 0 ? 0 : s >> 1;
  }

  // A slot's clock forgets its fences (its device was reset): dirty until its next fence.
  void mark_dirty(int slot) {
    if (slot != kNoSlot) slots_[slot].state.fetch_or(kDirty, std::memory_order_acq_rel);
  }

  // Some entry point that queues work is not hooked: from now on no slot is ever clean.
  void go_blind() {
    blind_.store(true, std::memory_order_seq_cst);
    for (int i = 0; i < kSlots; ++i) mark_dirty(i);
  }
  bool blind() const { return blind_.load(std::memory_order_acquire); }

 private:
  static constexpr std::uint64_t kDirty = 1;
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> state{kDirty};
  };
  alignas(64) std::atomic<int> used_{0};
  std::atomic<bool> blind_{false};
  std::array<Slot, kSlots> slots_;
};

}  // namespace cudalloc
