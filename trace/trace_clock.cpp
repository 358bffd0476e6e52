#include "trace/trace_clock.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace cudalloc {

std::int64_t monotonic_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

const std::int64_t g_origin_ns = monotonic_ns();

constexpr std::int64_t kNsPerSecond = 1000000000;

#if defined(__x86_64__)
// Ticks read after every earlier instruction and before any later one starts.
std::int64_t ordered_ticks() noexcept {
  _mm_lfence();
  const std::int64_t t = static_cast<std::int64_t>(__rdtsc());
  _mm_lfence();
  return t;
}

bool detect_tsc() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0x80000007, &a, &b, &c, &d) == 0 || (d & (1u << 8)) == 0) return false;  // invariant
  if (__get_cpuid(0x80000001, &a, &b, &c, &d) == 0 || (d & (1u << 27)) == 0) return false;  // RDTSCP
  // The kernel picks "tsc" only once it has found it stable and synchronized across CPUs.
  const int fd = ::open("/sys/devices/system/clocksource/clocksource0/current_clocksource",
                        O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[32] = {};
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  return n >= 3 && std::strncmp(buf, "tsc", 3) == 0 && (n == 3 || buf[3] == '\n');
}
#endif

}  // namespace

std::int64_t trace_origin_ns() noexcept { return g_origin_ns; }

bool tsc_usable() noexcept {
#if defined(__x86_64__)
  static const bool usable = detect_tsc();
  return usable;
#else
  return false;
#endif
}

TickConverter::TickConverter(bool tsc) noexcept : tsc_(tsc) {
  if (!tsc_) return;
  base_ = next_base_ = last_ = read_anchor();
}

TickConverter::Anchor TickConverter::read_anchor() const noexcept {
  Anchor best;
#if defined(__x86_64__)
  // The tightest of a few tries: a try the thread was preempted in is worthless.
  std::int64_t best_gap = INT64_MAX;
  for (int i = 0; i < 3; ++i) {
    const std::int64_t t1 = ordered_ticks();
    const std::int64_t ns = monotonic_ns() - g_origin_ns;
    const std::int64_t t2 = ordered_ticks();
    if (t2 - t1 < best_gap) {
      best_gap = t2 - t1;
      best = Anchor{t1 + (t2 - t1) / 2, ns};
    }
  }
#endif
  return best;
}

std::int64_t TickConverter::anchor_now() noexcept {
#if defined(__x86_64__)
  if (tsc_) {
    const Anchor a = read_anchor();
    if (a.ticks > base_.ticks) {
      ns_per_tick_ = static_cast<double>(a.ns - base_.ns) / static_cast<double>(a.ticks - base_.ticks);
    }
    if (a.ns - next_base_.ns >= kNsPerSecond) {
      base_ = next_base_;
      next_base_ = a;
    }
    last_ = a;
    return ordered_ticks();
  }
#endif
  return monotonic_ns() - g_origin_ns;
}

std::int64_t TickConverter::to_ns(std::int64_t ticks) noexcept {
  // Monotonic ticks are ns already; they too are clamped, since a thread preempted between
  // stamping and queueing hands in a stamp older than one already written.
  std::int64_t ns = ticks;
  if (tsc_) {
    ns = last_.ns;
    if (ns_per_tick_ > 0.0) {
      ns += static_cast<std::int64_t>(static_cast<double>(ticks - last_.ticks) * ns_per_tick_);
    }
  }
  if (ns < last_out_) ns = last_out_;
  last_out_ = ns;
  return ns;
}

std::int64_t TickConverter::now_ns() noexcept {
  std::int64_t ns = monotonic_ns() - g_origin_ns;
  if (ns < last_out_) ns = last_out_;
  last_out_ = ns;
  return ns;
}

}  // namespace cudalloc
