#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "allocator/fence_clock.h"

using namespace cudalloc;

namespace {

// Device fences that are done when the test says so; recording one, or a query of one, can be
// held open, as a driver call in progress on another thread is.
class GatedBackend final : public SegmentBackend {
 public:
  std::atomic<bool> complete{false};  // fences report done
  std::atomic<bool> hold{false};      // a record or query blocks while set
  std::atomic<bool> inside{false};    // a record or query is blocked now
  std::atomic<int> records{0};
  std::atomic<int> queries{0};
  std::atomic<bool> waitable{true};  // wait() can wait (false: a capture is on)
  std::atomic<int> waits{0};
  std::atomic<int> overlaps{0};  // a query made while another thread was inside wait()
  std::atomic<bool> hold_wait{false};  // wait() blocks while set
  std::atomic<bool> in_wait{false};

  void gate() {
    inside = true;
    while (hold) std::this_thread::yield();
    inside = false;
  }

  class GatedFence final : public Fence {
   public:
    explicit GatedFence(GatedBackend& b) : b_(b) {}
    bool done() override {
      ++b_.queries;
      if (b_.in_wait) ++b_.overlaps;
      b_.gate();
      return b_.complete;
    }
    bool wait() override {
      ++b_.waits;
      if (!b_.waitable) return false;
      b_.in_wait = true;
      while (b_.hold_wait) std::this_thread::yield();
      b_.in_wait = false;
      b_.complete = true;
      return true;
    }

   private:
    GatedBackend& b_;
  };

  std::unique_ptr<Fence> record_device_fence() override {
    gate();
    ++records;
    return std::make_unique<GatedFence>(*this);
  }
  std::unique_ptr<Fence> record_fence(StreamHandle) override { return record_device_fence(); }
  Status allocate_segment(std::size_t, DevicePtr*) override { return Status::kOutOfMemory; }
  Status free_segment(DevicePtr, std::size_t) override { return Status::kOk; }
  std::size_t total_memory() const override { return 0; }
};

// Runs `other` on a thread, where the backend holds its record or query open, then `ask` on
// another: that call must still be waiting 50 ms later. Releases the hold and returns what
// `ask` answered.
template <typename Ask, typename F>
auto asked_behind(GatedBackend& backend, Ask&& ask, F&& other) {
  backend.hold = true;
  std::thread holder(std::forward<F>(other));
  while (!backend.inside) std::this_thread::yield();

  std::atomic<bool> finished{false};
  decltype(ask()) result{};
  std::thread asker([&] {
    result = ask();
    finished = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(finished);  // waiting for the other thread's answer
  backend.hold = false;
  holder.join();
  asker.join();
  return result;
}

// asked_behind() of clock.passed(ticket).
template <typename F>
bool passed_behind(FenceClock& clock, std::uint64_t ticket, GatedBackend& backend, F&& other) {
  return asked_behind(backend, [&] { return clock.passed(ticket, backend); }, std::forward<F>(other));
}

// Starts a thread recording the fence that covers `ticket`, held open (backend.hold) until the
// test clears hold; returns once the recording is under way.
std::thread recording_held(FenceClock& clock, GatedBackend& backend, std::uint64_t ticket) {
  backend.hold = true;
  std::thread recorder([&clock, &backend, ticket] { clock.cover(ticket, backend); });
  while (!backend.inside) std::this_thread::yield();
  return recorder;
}

}  // namespace

TEST_CASE("a batch's fence being queried by another thread is waited for, not reported as not passed") {
  GatedBackend backend;
  FenceClock clock;
  const std::uint64_t ticket = clock.stamp();
  clock.cover(ticket, backend);
  REQUIRE(backend.records == 1);
  backend.complete = true;
  CHECK(passed_behind(clock, ticket, backend, [&] { clock.passed_now(ticket); }));
  CHECK(backend.records == 1);  // no fence of its own
}

TEST_CASE("a batch's fence being recorded by another thread is waited for, then queried") {
  GatedBackend backend;
  FenceClock clock;
  const std::uint64_t ticket = clock.stamp();
  backend.complete = true;
  CHECK(passed_behind(clock, ticket, backend, [&] { clock.cover(ticket, backend); }));
  CHECK(backend.records == 1);  // the other thread's fence covered it
}

TEST_CASE("a fence the device has not passed is not waited for") {
  GatedBackend backend;
  FenceClock clock;
  const std::uint64_t first = clock.stamp();
  CHECK_FALSE(clock.passed(first, backend));  // records a fence; the device is behind it
  CHECK(backend.records == 1);
  CHECK_FALSE(clock.passed(first, backend));  // still behind; the same fence is asked again
  CHECK(backend.records == 1);
  backend.complete = true;
  CHECK(clock.passed(first, backend));
  const std::uint64_t second = clock.stamp();  // closed after that fence: needs its own
  CHECK(clock.passed(second, backend));
  CHECK(backend.records == 2);
}

TEST_CASE("a ticket known past asks nothing of the device, even while newer fences are pending") {
  GatedBackend backend;
  FenceClock clock;
  const std::uint64_t first = clock.stamp();
  backend.complete = true;
  CHECK(clock.passed(first, backend));
  const int queries = backend.queries;
  const std::uint64_t second = clock.stamp();
  clock.cover(second, backend);  // a newer fence, not done yet
  backend.complete = false;
  CHECK(clock.passed_now(first));
  CHECK(clock.passed(first, backend));
  CHECK(backend.queries == queries);
  CHECK(backend.records == 2);
  CHECK_FALSE(clock.passed_now(second));  // that one is still asked about
  CHECK(backend.queries == queries + 1);
}

TEST_CASE("batches closed while another thread records are covered by that thread, without waiting") {
  GatedBackend backend;
  FenceClock clock;
  const std::uint64_t first = clock.stamp();
  std::thread recorder = recording_held(clock, backend, first);
  // Two more batches close while that fence is being recorded: neither thread waits for it.
  const std::uint64_t second = clock.stamp();
  const std::uint64_t third = clock.stamp();
  std::atomic<int> returned{0};
  std::thread a([&] { clock.cover(second, backend); ++returned; });
  std::thread b([&] { clock.cover(third, backend); ++returned; });
  a.join();
  b.join();
  CHECK(returned == 2);
  CHECK(backend.records == 0);  // the first is still being recorded
  backend.hold = false;
  recorder.join();
  // The recorder went round once more: one fence for both.
  CHECK(backend.records == 2);
  backend.complete = true;
  CHECK(clock.passed(third, backend));
  CHECK(clock.passed_now(second));
  CHECK(backend.records == 2);
}

TEST_CASE("a covered batch records nothing more, and an uncovered one is recorded at once") {
  GatedBackend backend;
  FenceClock clock;
  const std::uint64_t first = clock.stamp();
  const std::uint64_t second = clock.stamp();
  clock.cover(second, backend);  // covers every batch closed so far
  CHECK(backend.records == 1);
  clock.cover(first, backend);
  clock.cover(second, backend);
  CHECK(backend.records == 1);
  const std::uint64_t third = clock.stamp();
  clock.cover(third, backend);
  CHECK(backend.records == 2);
}

TEST_CASE("try_passed answers busy at once while another thread records the fence that will cover the ticket") {
  GatedBackend backend;
  FenceClock clock;
  const std::uint64_t first = clock.stamp();
  std::thread recorder = recording_held(clock, backend, first);
  const std::uint64_t second = clock.stamp();  // closed while that fence is being recorded
  std::atomic<bool> answered{false};
  FenceClock::Answer answer = FenceClock::Answer::kPassed;
  std::thread asker([&] {
    answer = clock.try_passed(second, backend);
    answered = true;
  });
  for (int i = 0; i < 200 && !answered; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool without_waiting = answered;  // passed() would still wait here
  backend.hold = false;
  recorder.join();
  asker.join();
  CHECK(without_waiting);
  CHECK(answer == FenceClock::Answer::kBusy);
  CHECK(backend.queries == 0);
  // The recorder went round once more for it: the next try finds it covered and asks the device.
  CHECK(backend.records == 2);
  CHECK(clock.try_passed(second, backend) == FenceClock::Answer::kNotYet);
  backend.complete = true;
  CHECK(clock.try_passed(second, backend) == FenceClock::Answer::kPassed);
  CHECK(clock.try_passed(first, backend) == FenceClock::Answer::kPassed);
  CHECK(backend.records == 2);
}

TEST_CASE("try_passed records a fence itself when no other thread is, and waits for another thread's query") {
  GatedBackend backend;
  FenceClock clock;
  const std::uint64_t ticket = clock.stamp();
  CHECK(clock.try_passed(ticket, backend) == FenceClock::Answer::kNotYet);  // recorded here; device behind
  CHECK(backend.records == 1);
  backend.complete = true;
  // Another thread is querying that fence: the answer is waited for (a driver call), not "busy".
  const FenceClock::Answer answer = asked_behind(
      backend, [&] { return clock.try_passed(ticket, backend); }, [&] { clock.passed_now(ticket, /*wait=*/true); });
  CHECK(answer == FenceClock::Answer::kPassed);
  CHECK(backend.records == 1);
}

TEST_CASE("wait_passed waits for a fence only as the querying thread, and gives up when it cannot wait") {
  GatedBackend backend;
  FenceClock clock;
  const std::uint64_t ticket = clock.stamp();
  clock.cover(ticket, backend);
  // While one thread waits for the fence, another thread's query of it waits its turn (two
  // threads in one fence's calls would give its events back twice).
  // (Catch's assertions are for the test's own thread: the others only note their answers.)
  backend.hold_wait = true;
  std::atomic<bool> waited{false}, asked{false};
  std::thread waiter([&] { waited = clock.wait_passed(ticket, backend); });
  while (!backend.in_wait) std::this_thread::yield();
  std::thread asker([&] { asked = clock.passed_now(ticket, /*wait=*/true); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  backend.hold_wait = false;
  waiter.join();
  asker.join();
  CHECK(waited);
  CHECK(asked);
  CHECK(backend.overlaps == 0);
  CHECK(clock.passed_now(ticket));
  // A fence that cannot be waited for now: an answer at once, not a spin.
  GatedBackend capturing;
  capturing.waitable = false;
  FenceClock other;
  const std::uint64_t t = other.stamp();
  CHECK_FALSE(other.wait_passed(t, capturing));
  CHECK(capturing.waits == 1);
  CHECK_FALSE(other.passed_now(t));
}
