// TickConverter: ticks to ts_ns across anchors, baselines and rebases, on the real clocks.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "trace/trace_clock.h"

using namespace cudalloc;

namespace {

std::int64_t since_origin() { return monotonic_ns() - trace_origin_ns(); }

}  // namespace

TEST_CASE("ticks convert to CLOCK_MONOTONIC across the rate's rebase", "[clock]") {
  // Stamps over 1.5 s (past the first rebase of the rate's baseline, at 1 s), converted a pass
  // later as the writer does: each must land within its CLOCK_MONOTONIC bracket.
  const TraceClock clock;
  TickConverter conv(clock.tsc());
  struct Stamp {
    std::int64_t ticks, before, after;
  };
  std::int64_t last = -1;
  std::size_t outside = 0, total = 0;
  for (int pass = 0; pass < 15; ++pass) {
    std::vector<Stamp> stamps;
    for (int i = 0; i < 4; ++i) {
      const std::int64_t before = since_origin();
      const std::int64_t ticks = clock.stamp();
      stamps.push_back(Stamp{ticks, before, since_origin()});
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    const std::int64_t cutoff = conv.anchor_now();
    for (const Stamp& s : stamps) {
      CHECK(s.ticks < cutoff);
      const std::int64_t ns = conv.to_ns(s.ticks);
      CHECK(ns >= last);
      last = ns;
      ++total;
      if (ns < s.before - 20000 || ns > s.after + 20000) {
        ++outside;
        WARN("pass " << pass << ": " << ns << " not in [" << s.before << ", " << s.after << "]");
      }
    }
  }
  CHECK(total == 60);
  CHECK(outside == 0);
}

TEST_CASE("converted times never go back, even for an older stamp", "[clock]") {
  // A record stamped before one already written (its thread was preempted between stamping
  // and queueing) is written with the later time, not before it.
  const TraceClock clock;
  TickConverter conv(clock.tsc());
  const std::int64_t early = clock.stamp();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const std::int64_t late = clock.stamp();
  conv.anchor_now();
  const std::int64_t late_ns = conv.to_ns(late);
  CHECK(conv.to_ns(early) >= late_ns);
  CHECK(conv.now_ns() >= late_ns);
  if (!clock.tsc()) WARN("no usable TSC here: only the identity conversion was tested");
}

TEST_CASE("the monotonic clock converts as the identity", "[clock]") {
  const TraceClock clock(TraceClockSource::kMonotonic);
  CHECK_FALSE(clock.tsc());
  TickConverter conv(false);
  const std::int64_t before = since_origin();
  const std::int64_t t = clock.stamp();
  CHECK(t >= before);
  CHECK(t <= since_origin());
  CHECK(conv.to_ns(t) == t);
  CHECK(conv.to_ns(t + 5) == t + 5);
  CHECK(conv.to_ns(t - 5) == t + 5);  // an older stamp is written no earlier than the last one
}
