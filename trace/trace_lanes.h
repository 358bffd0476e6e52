// The trace writer's per-thread record lanes.
//
// Each allocating thread fills a lane of its own: a bounded single-producer, single-consumer ring.
// Recording an event writes only cache lines that this thread owns, so threads that allocate at
// once never contend, and when the writer falls behind a dropped record costs a private counter
// increment (one shared line is read to see whether room came back). The writer thread is the
// only consumer; it merges the lanes by timestamp (TraceWriter::drain_locked).
//
// Lifetime: a lane belongs to the writer (LaneSet) and to the thread using it (a shared_ptr in
// thread-local storage), so neither the writer's destruction nor the thread's exit frees memory
// the other still reads. A thread that exits leaves its lane orphaned; once drained, the lane is
// free and goes to the next new thread, so a program that starts many short threads keeps a
// bounded number of lanes.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace cudalloc {

struct TraceRecord {
  std::int64_t ts;
  std::uint64_t ptr;
  std::uint64_t stream;
  std::uint64_t requested;
  std::uint64_t rounded;
  std::uint64_t allocated;
  std::uint64_t reserved;
  std::int32_t tid;
  std::int32_t device;
  std::uint32_t nvtx_id;  // with the id hooks; 0: none (or text in the lane's nvtx buffer)
  std::uint8_t kind;
  std::uint8_t result;
  std::uint8_t flags;
  std::uint8_t nstack;
  std::uint8_t nvtx_len;
};

// Both cache lines a record may span, fetched for ownership (prefetchw: a NOP on x86 CPUs
// without it; a plain prefetch elsewhere).
inline void prefetch_for_write(const void* p) noexcept {
  const char* c = static_cast<const char*>(p);
#if defined(__x86_64__)
  asm volatile("prefetchw %0" : : "m"(*c));
  asm volatile("prefetchw %0" : : "m"(*(c + sizeof(TraceRecord) - 1)));
#else
  __builtin_prefetch(c, 1, 3);
  __builtin_prefetch(c + sizeof(TraceRecord) - 1, 1, 3);
#endif
}

class TraceLane {
 public:
  enum State : int { kOwned = 0, kOrphaned = 1, kFree = 2 };

  // capacity: a power of two. stack_depth and nvtx_bytes size the per-record side buffers.
  TraceLane(std::size_t capacity, std::size_t stack_depth, std::size_t nvtx_bytes);

  // --- producer (the owning thread)
  // The slot for the next record, or null when the lane is full (the drop is counted).
  std::size_t try_claim() noexcept {
    const std::uint64_t h = head_local_;
    if (h - tail_seen_ > mask_) {
      tail_seen_ = tail_.load(std::memory_order_acquire);
      if (h - tail_seen_ > mask_) {
        dropped_.store(++dropped_local_, std::memory_order_relaxed);
        return kFull;
      }
    }
    // The slot a few records on was last read by the writer thread, so writing it would first
    // fetch its line back for ownership; the next locked instruction (a spin lock, a counter)
    // waits for that store. Asking for ownership now hides the fetch behind this record.
    prefetch_for_write(&records_[(h + kPrefetchAhead) & mask_]);
    return static_cast<std::size_t>(h & mask_);
  }
  // `ts` raised, where needed, to the lane's previous stamp, so a thread's records never go
  // back in time (a local stamp is not ordered after the previous one: TraceClock).
  std::int64_t order_stamp(std::int64_t ts) noexcept {
    if (ts < last_ts_) ts = last_ts_;
    last_ts_ = ts;
    return ts;
  }
  // Makes the claimed record visible; returns its position (for wake-up pacing).
  std::uint64_t publish() noexcept {
    const std::uint64_t h = head_local_++;
    head_.store(h + 1, std::memory_order_release);
    return h;
  }
  static constexpr std::size_t kFull = ~std::size_t{0};
  static constexpr std::size_t kPrefetchAhead = 8;

  TraceRecord& record(std::size_t slot) noexcept { return records_[slot]; }
  // Null when the lane was made without that side buffer (UBSan: no reference through null).
  std::uintptr_t* pcs(std::size_t slot) noexcept { return pcs_.get() + slot * stack_depth_; }
  char* nvtx(std::size_t slot) noexcept { return nvtx_.get() + slot * nvtx_bytes_; }

  // --- consumer (one at a time: the writer's consumer lock)
  std::uint64_t head() const noexcept { return head_.load(std::memory_order_acquire); }
  std::uint64_t tail() const noexcept { return tail_.load(std::memory_order_relaxed); }
  std::size_t slot(std::uint64_t pos) const noexcept { return static_cast<std::size_t>(pos & mask_); }
  // Frees the records before `pos` for the producer to reuse.
  void release_until(std::uint64_t pos) noexcept { tail_.store(pos, std::memory_order_release); }
  // Drops counted since the last call.
  std::uint64_t take_new_drops() noexcept {
    const std::uint64_t d = dropped_.load(std::memory_order_relaxed);
    const std::uint64_t n = d - dropped_reported_;
    dropped_reported_ = d;
    return n;
  }
  std::uint64_t dropped_ever() const noexcept { return dropped_.load(std::memory_order_relaxed); }

  // Forgets every record and drop count (a fork child: they were the parent's).
  void discard_all() noexcept;

  std::atomic<int> state{kOwned};

 private:
  // Producer line: written by the owning thread; read by the consumer.
  alignas(64) std::atomic<std::uint64_t> head_{0};
  std::atomic<std::uint64_t> dropped_{0};
  std::uint64_t head_local_ = 0;
  std::uint64_t tail_seen_ = 0;
  std::uint64_t dropped_local_ = 0;
  std::int64_t last_ts_ = 0;
  // Consumer line.
  alignas(64) std::atomic<std::uint64_t> tail_{0};
  std::uint64_t dropped_reported_ = 0;

  alignas(64) std::size_t mask_;
  std::size_t stack_depth_;
  std::size_t nvtx_bytes_;
  std::unique_ptr<TraceRecord[]> records_;
  std::unique_ptr<std::uintptr_t[]> pcs_;
  std::unique_ptr<char[]> nvtx_;
};

// The lanes of one writer. Registration takes a mutex (once per thread); the consumer reads the
// lane table without one, so a signal handler can drain it.
class LaneSet {
 public:
  static constexpr std::size_t kMaxLanes = 1024;

  LaneSet(std::size_t capacity, std::size_t stack_depth, std::size_t nvtx_bytes)
      : capacity_(capacity), stack_depth_(stack_depth), nvtx_bytes_(nvtx_bytes) {}

  // A lane for the calling thread: a free one, else a new one. Null when kMaxLanes are in use
  // or memory ran out (the caller counts the record as dropped).
  std::shared_ptr<TraceLane> acquire() noexcept;

  std::size_t count() const noexcept { return count_.load(std::memory_order_acquire); }
  TraceLane* at(std::size_t i) const noexcept { return table_[i]; }

 private:
  std::size_t capacity_, stack_depth_, nvtx_bytes_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<TraceLane>> owned_;
  std::array<TraceLane*, kMaxLanes> table_{};
  std::atomic<std::size_t> count_{0};
};

}  // namespace cudalloc
