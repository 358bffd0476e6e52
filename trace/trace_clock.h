// Timestamps of trace records.
//
// An allocating thread stamps its record with raw ticks; the writer thread turns ticks into the
// trace's ts_ns (nanoseconds of CLOCK_MONOTONIC since cudalloc was loaded). Where the kernel
// itself keeps time with the TSC, having checked that it is invariant and agrees across CPUs, a
// tick is a TSC count: RDTSCP is cheaper than clock_gettime (bench_pairs --probe compares
// them), and a traced pair stamps two records. Elsewhere, or with trace_clock:monotonic, a tick is a
// nanosecond of CLOCK_MONOTONIC and the conversion is the identity (never going back, as below).
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace cudalloc {

// CLOCK_MONOTONIC in nanoseconds (vDSO: no system call).
std::int64_t monotonic_ns() noexcept;
// CLOCK_MONOTONIC when cudalloc was loaded: ts_ns = 0.
std::int64_t trace_origin_ns() noexcept;

enum class TraceClockSource : std::uint8_t {
  kTsc,        // the TSC where tsc_usable(), else monotonic
  kMonotonic,  // clock_gettime(CLOCK_MONOTONIC) per record
};

// An invariant TSC with RDTSCP, and the kernel's clocksource is "tsc". Checked once.
bool tsc_usable() noexcept;

// The producer side: a record's stamp.
class TraceClock {
 public:
  explicit TraceClock(TraceClockSource source = TraceClockSource::kTsc) noexcept
      : tsc_(source == TraceClockSource::kTsc && tsc_usable()) {}
  bool tsc() const noexcept { return tsc_; }

  // RDTSCP waits for every earlier load: a record made possible by another thread's record (a
  // block freed there, then taken here through a lock or an atomic) is stamped after it, which
  // the writer's merge relies on (TraceWriter::drain_locked).
  std::int64_t stamp() const noexcept {
#if defined(__x86_64__)
    if (tsc_) {
      unsigned aux;
      return static_cast<std::int64_t>(__rdtscp(&aux));
    }
#endif
    return monotonic_ns() - trace_origin_ns();
  }

  // For a record whose causes were all recorded by this thread (AllocatorEvent::local): RDTSC
  // does not wait for earlier loads, which is a good part of what RDTSCP costs a record. The thread's
  // own order is kept by its lane, and the writer keeps the stamp from going below the lane's
  // previous one.
  std::int64_t stamp_local() const noexcept {
#if defined(__x86_64__)
    if (tsc_) return static_cast<std::int64_t>(__rdtsc());
#endif
    return monotonic_ns() - trace_origin_ns();
  }

 private:
  bool tsc_;
};

// The consumer side: cutoffs in ticks and ticks to ts_ns. Used by one thread at a time (the
// writer's consumer lock); no allocation, async-signal-safe (the fatal-signal flush uses it).
class TickConverter {
 public:
  explicit TickConverter(bool tsc) noexcept;

  // Pairs the tick counter with CLOCK_MONOTONIC now and returns the ticks, read after every
  // earlier load and before every later one: a drain pass's cutoff.
  std::int64_t anchor_now() noexcept;

  // ts_ns of a record stamped at `ticks`: from the latest anchor at the rate measured over the
  // last one to two seconds. Never below what it returned before, so the merged file stays in
  // order across passes despite the anchors' jitter (tens of nanoseconds).
  std::int64_t to_ns(std::int64_t ticks) noexcept;

  // ts_ns now (for lines that carry no record's stamp, such as `dropped`); also never below
  // what was returned before.
  std::int64_t now_ns() noexcept;

 private:
  struct Anchor {
    std::int64_t ticks = 0;
    std::int64_t ns = 0;  // since the origin
  };
  Anchor read_anchor() const noexcept;

  bool tsc_;
  Anchor base_;       // the rate is measured from here to the latest anchor
  Anchor next_base_;  // becomes base_ when a second old, so the baseline stays 1 to 2 s
  Anchor last_;
  double ns_per_tick_ = 0.0;
  std::int64_t last_out_ = 0;
};

}  // namespace cudalloc
