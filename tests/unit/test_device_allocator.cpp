#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"
#include "allocator/thread_cache.h"
#include "sim_fixture.h"

using namespace cudalloc;
using cudalloc::testing::Fixture;

namespace {

constexpr StreamHandle kStreamA = 0x10;
constexpr StreamHandle kStreamB = 0x20;

// Two contexts of one device: allocators, each on a simulated backend of its own, that share
// one budget under kLimit. Tests name the parts with references (a structured binding cannot
// be captured by a lambda before C++20, nor by clang 14's).
struct TwoContexts {
  static constexpr std::size_t kLimit = 64 * kMiB;
  static AllocatorOptions limited(bool expandable) {
    AllocatorOptions o;
    o.memory_limit_bytes = kLimit;
    o.expandable_segments = expandable;
    return o;
  }
  explicit TwoContexts(bool a_expandable = false, bool b_expandable = false)
      : a(limited(a_expandable)), b(limited(b_expandable)) {
    a.alloc.share_budget(budget);
    b.alloc.share_budget(budget);
  }
  std::shared_ptr<DeviceBudget> budget = std::make_shared<DeviceBudget>();
  Fixture a;
  Fixture b;
};

}  // namespace

TEST_CASE("a zero-byte request is the driver's invalid value and allocates nothing") {
  Fixture f;
  DevicePtr p = 123;
  CHECK(f.alloc.allocate(0, kNoStream, &p) == Status::kInvalidValue);
  CHECK(p == 0);
  CHECK(f.sim.segment_calls() == 0);
}

TEST_CASE("small requests share a 2 MiB segment and are 512-byte aligned") {
  Fixture f;
  DevicePtr a = f.get(1);
  DevicePtr b = f.get(700);
  DevicePtr c = f.get(1000);
  CHECK(f.sim.segment_calls() == 1);
  CHECK(a % 512 == 0);
  CHECK(b % 512 == 0);
  CHECK(c % 512 == 0);
  CHECK(b == a + 512);
  CHECK(c == b + 1024);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(2 * kMiB));
  CHECK(f.stat("reserved_bytes.small_pool.current") == static_cast<std::int64_t>(2 * kMiB));
  CHECK(f.stat("allocated_bytes.all.current") == 512 + 1024 + 1024);
  CHECK(f.stat("requested_bytes.all.current") == 1 + 700 + 1000);
}

TEST_CASE("a block freed on its own stream is reused there at once") {
  Fixture f;
  DevicePtr a = f.get(4096, kStreamA);
  f.sim.enqueue(kStreamA);  // device work still queued on A: irrelevant for A itself
  REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA) == Status::kOk);
  CHECK(f.get(4096, kStreamA) == a);
  CHECK(f.sim.segment_calls() == 1);
  CHECK(f.sim.stream_fences() == 0);
}

// Requests of 12 MiB get a segment of exactly 12 MiB: no remainder blurs what is reused.
constexpr std::size_t kWhole = 12 * kMiB;

TEST_CASE("another stream reuses a freed segment only after the free's stream passed it") {
  Fixture f;
  DevicePtr a = f.get(kWhole, kStreamA);
  f.sim.enqueue(kStreamA);
  REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA) == Status::kOk);
  // Stream A has queued work that may still use `a`: B must get other memory.
  DevicePtr b = f.get(kWhole, kStreamB);
  CHECK(b != a);
  CHECK(f.sim.segment_calls() == 2);
  // Once A's work ran, A's idle segment may move to B.
  f.sim.run_all();
  DevicePtr c = f.get(kWhole, kStreamB);
  CHECK(c == a);
  CHECK(f.sim.segment_calls() == 2);
  // It now belongs to B: freeing it on B makes it B's at once.
  f.alloc.free(c, FreeOrder::kStream, kStreamB);
  CHECK(f.get(kWhole, kStreamB) == a);
}

TEST_CASE("cudaFreeAsync on another stream waits for that stream's work") {
  Fixture f;
  DevicePtr a = f.get(kWhole, kStreamA);
  f.sim.enqueue(kStreamB);
  REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamB) == Status::kOk);
  CHECK(f.stat("active_bytes.all.current") == static_cast<std::int64_t>(kWhole));  // pending is active
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  DevicePtr again = f.get(kWhole, kStreamA);
  CHECK(again != a);
  f.sim.run(kStreamB);
  CHECK(f.get(kWhole, kStreamA) == a);
  CHECK(f.stat("active_bytes.all.current") == static_cast<std::int64_t>(2 * kWhole));
}

TEST_CASE("record_stream makes a free wait for the extra stream") {
  Fixture f;
  DevicePtr a = f.get(kWhole, kStreamA);
  REQUIRE(f.alloc.record_stream(a, kStreamB) == Status::kOk);
  f.sim.enqueue(kStreamB);
  f.alloc.free(a, FreeOrder::kStream, kStreamA);
  CHECK(f.get(kWhole, kStreamA) != a);
  f.sim.run(kStreamB);
  CHECK(f.get(kWhole, kStreamA) == a);
  CHECK(f.alloc.record_stream(0xdead, kStreamB) == Status::kInvalidValue);
}

// With free_epoch_bytes 0 the epoch is fenced at every miss: the rules show one free at a time.
AllocatorOptions fence_every_miss() {
  AllocatorOptions o;
  o.free_epoch_bytes = 0;
  return o;
}

TEST_CASE("a cudaFree'd block waits for work queued on every stream") {
  Fixture f(fence_every_miss());
  DevicePtr a = f.get(kWhole);
  f.sim.enqueue(kStreamA);  // some stream still has queued work at the free
  REQUIRE(f.alloc.free(a, FreeOrder::kDevice) == Status::kOk);
  DevicePtr b = f.get(kWhole);
  CHECK(b != a);
  CHECK(f.sim.device_fences() == 1);  // the miss closed the epoch with one fence
  f.sim.enqueue(kStreamB);  // work queued after that fence does not matter
  f.sim.run(kStreamA);
  CHECK(f.get(kWhole) == a);
  CHECK(f.sim.queued(kStreamB) == 1);
}

// A program whose streams all order with the legacy stream: a device fence orders the reuse
// of what it covers (backend.h), so cudaFree'd blocks come back before the device catches up.
SimOptions blocking_streams() {
  SimOptions so;
  so.blocking_streams = true;
  return so;
}

TEST_CASE("behind a fence that orders reuse, a cudaFree'd block serves again before the device ran") {
  Fixture f(fence_every_miss(), blocking_streams());
  DevicePtr a = f.get(kWhole);
  f.sim.enqueue(kStreamA);  // its last owner's work, still queued
  REQUIRE(f.alloc.free(a, FreeOrder::kDevice) == Status::kOk);
  CHECK(f.get(kWhole) == a);
  CHECK(f.sim.device_fences() == 1);
  CHECK(f.sim.queued(kStreamA) == 1);
  CHECK(f.sim.segment_calls() == 1);
  // Stream-ordered frees onto another stream still wait for that stream: a stream fence orders
  // nothing on the block's own stream.
  DevicePtr s = f.get(kWhole, kStreamA);
  f.sim.enqueue(kStreamB);
  REQUIRE(f.alloc.free(s, FreeOrder::kStream, kStreamB) == Status::kOk);
  CHECK(f.get(kWhole, kStreamA) != s);
}

TEST_CASE("behind fences that order reuse, cudaFree'd small blocks refill the thread cache before the device ran") {
  for (const bool ordered : {false, true}) {
    Fixture f({}, ordered ? blocking_streams() : SimOptions{});
    f.sim.set_fences_stall(true);  // a device far behind: no fence completes
    std::vector<DevicePtr> first;
    for (int i = 0; i < 1000; ++i) first.push_back(f.get(64 * 1024));
    for (DevicePtr p : first) REQUIRE(f.alloc.free(p, FreeOrder::kDevice) == Status::kOk);
    const std::size_t segments = f.sim.segment_calls();
    std::set<DevicePtr> again;
    for (int i = 0; i < 1000; ++i) again.insert(f.get(64 * 1024));
    INFO("fences order reuse: " << ordered);
    const auto reused = std::count_if(first.begin(), first.end(), [&](DevicePtr p) { return again.count(p) != 0; });
    if (ordered) {
      // The closed batches come back through the bins; the frees still deferred in the open
      // batch (fewer than a full one) do not, and their place is cut anew (32 blocks a segment).
      CHECK(reused > 1000 - static_cast<long>(ThreadCache::kBatchBlocks));
      CHECK(reused < 1000);
      CHECK(f.sim.segment_calls() - segments <= 8);
    } else {
      CHECK(reused == 0);
      CHECK(f.sim.segment_calls() - segments >= 1000 / 32);
    }
  }
}

TEST_CASE("frees of one epoch share a single device fence") {
  AllocatorOptions o = fence_every_miss();
  o.thread_cache = false;  // the allocator's epoch, not a thread's batches
  Fixture f(o);
  std::vector<DevicePtr> ptrs;
  // 1 MiB blocks fill their 2 MiB segments exactly, two each.
  for (int i = 0; i < 100; ++i) ptrs.push_back(f.get(kMiB));
  for (DevicePtr p : ptrs) f.alloc.free(p, FreeOrder::kDevice);
  std::set<DevicePtr> reused;
  for (int i = 0; i < 100; ++i) reused.insert(f.get(kMiB));
  CHECK(f.sim.segment_calls() == 50);
  CHECK(f.sim.device_fences() == 1);
  CHECK(reused == std::set<DevicePtr>(ptrs.begin(), ptrs.end()));
}

TEST_CASE("the epoch is fenced only once it holds free_epoch_bytes, or memory is short") {
  AllocatorOptions o;
  o.thread_cache = false;  // the allocator's epoch, not a thread's batches
  o.free_epoch_bytes = 3 * kWhole;
  o.memory_limit_bytes = 6 * kWhole;
  Fixture f(o);
  std::vector<DevicePtr> first;
  for (int i = 0; i < 3; ++i) {
    DevicePtr p = f.get(kWhole);
    first.push_back(p);
    f.alloc.free(p, FreeOrder::kDevice);
  }
  // Three frees below the budget: each miss cut new memory rather than fence.
  CHECK(f.sim.device_fences() == 0);
  CHECK(f.sim.segment_calls() == 3);
  // Now the epoch holds the budget: the next miss fences it and reuses its blocks.
  DevicePtr again = f.get(kWhole);
  CHECK(f.sim.device_fences() == 1);
  CHECK(f.sim.segment_calls() == 3);
  CHECK(std::find(first.begin(), first.end(), again) != first.end());
  // Close to the limit the epoch is fenced whatever its size.
  AllocatorOptions tight = o;
  tight.memory_limit_bytes = kWhole;
  Fixture g(tight);
  DevicePtr p = g.get(kWhole);
  g.alloc.free(p, FreeOrder::kDevice);
  CHECK(g.get(kWhole) == p);
  CHECK(g.sim.device_fences() == 1);
}

TEST_CASE("a cudaFree'd large block serves a request that would split a bigger free block, while the device keeps up") {
  AllocatorOptions o;
  o.thread_cache = false;  // the allocator's epoch: a thread cycling the size keeps its frees
  Fixture f(o);
  const DevicePtr a = f.get(kWhole);
  const DevicePtr c = f.get(kWhole);
  const DevicePtr big = f.get(40 * kMiB);
  REQUIRE(f.alloc.free(big, FreeOrder::kCompleted) == Status::kOk);  // a whole free 40 MiB segment
  f.sim.enqueue(kStreamA);  // device work queued before the frees below
  REQUIRE(f.alloc.free(a, FreeOrder::kDevice) == Status::kOk);     // into the open epoch
  // No epoch closed before: the epoch is closed for this request. Its fence waits for the
  // work on A, so `a` is out of reach and the 40 MiB block is split.
  CHECK(f.get(kWhole) == big);
  CHECK(f.sim.device_fences() == 1);
  // The device lags (that fence is outstanding): the next cudaFree'd block stays in the open
  // epoch and the split remainder serves.
  REQUIRE(f.alloc.free(c, FreeOrder::kDevice) == Status::kOk);
  CHECK(f.get(kWhole) == big + kWhole);
  CHECK(f.sim.device_fences() == 1);
  // Once the device has passed the fence, the epoch holding `c` is closed for the next request
  // that would split a block, and `a` or `c`, exact fits, serve rather than the 16 MiB left.
  f.sim.run_all();
  const DevicePtr next = f.get(kWhole);
  CHECK((next == a || next == c));
  CHECK(f.sim.device_fences() == 2);
  CHECK(f.sim.segment_calls() == 3);
}

TEST_CASE("a program far ahead of the device waits for the oldest fence past max_pending_bytes") {
  // Every free has device work queued before it that has not run: without a bound each miss
  // would cut new memory, as far as the limit allows.
  auto run = [](std::size_t max_pending) {
    AllocatorOptions o = fence_every_miss();
    o.max_pending_bytes = max_pending;
    Fixture f(o);
    for (int i = 0; i < 20; ++i) {
      f.sim.enqueue(kStreamA);
      f.alloc.free(f.get(kWhole), FreeOrder::kDevice);
    }
    return std::make_pair(f.stat("reserved_bytes.all.peak"), f.stat("num_pending_waits"));
  };
  const auto [unbounded_peak, unbounded_waits] = run(0);
  CHECK(unbounded_peak == static_cast<std::int64_t>(20 * kWhole));
  CHECK(unbounded_waits == 0);
  const auto [bounded_peak, bounded_waits] = run(4 * kWhole);
  // Past 4 blocks pending, a miss waits (the simulated device runs the queued work) and
  // reuses the oldest block instead of growing.
  CHECK(bounded_peak <= static_cast<std::int64_t>(5 * kWhole));
  CHECK(bounded_waits > 0);
}

TEST_CASE("the pending bound only makes a miss wait for its own pool's pending frees") {
  AllocatorOptions o = fence_every_miss();
  o.thread_cache = false;  // small frees go to the allocator's epoch
  o.max_pending_bytes = 2 * kMiB;
  Fixture f(o);
  std::vector<DevicePtr> small;
  for (int i = 0; i < 8; ++i) small.push_back(f.get(kMiB));
  f.sim.enqueue(kStreamA);  // never runs by itself: the small frees stay pending
  for (DevicePtr p : small) f.alloc.free(p, FreeOrder::kDevice);
  f.get(3 * kWhole);  // large: waiting on small-pool fences could not serve it
  CHECK(f.stat("num_pending_waits") == 0);
  CHECK(f.sim.queued(kStreamA) == 1);
  f.get(kMiB);  // small: over the bound, so it waits (the simulated device runs the work)
  CHECK(f.stat("num_pending_waits") >= 1);
  CHECK(f.sim.queued(kStreamA) == 0);
}

TEST_CASE("a thread fences its cudaFree'd small blocks in batches and reuses them without the lock") {
  Fixture f;
  std::vector<DevicePtr> ptrs;
  for (std::size_t i = 0; i < ThreadCache::kFirstBatchBlocks; ++i) ptrs.push_back(f.get(4096));
  f.sim.enqueue(kStreamA);  // device work queued before the frees
  for (DevicePtr p : ptrs) f.alloc.free(p, FreeOrder::kDevice);
  CHECK(f.sim.device_fences() == 1);  // one for the whole batch, recorded when it closed
  // While it is pending, the batch is not reused, and the miss records no other fence.
  const auto hits_before = f.stat("num_cache_hits");
  DevicePtr fresh = f.get(4096);
  CHECK(f.sim.device_fences() == 1);
  CHECK(std::find(ptrs.begin(), ptrs.end(), fresh) == ptrs.end());
  f.alloc.free(fresh, FreeOrder::kCompleted);
  f.sim.run(kStreamA);
  std::set<DevicePtr> reused;
  for (std::size_t i = 0; i < ThreadCache::kFirstBatchBlocks; ++i) reused.insert(f.get(4096));
  CHECK(f.stat("num_cache_hits") - hits_before >= static_cast<std::int64_t>(ThreadCache::kFirstBatchBlocks));
  for (DevicePtr p : reused) {
    INFO(p);
    CHECK((std::find(ptrs.begin(), ptrs.end(), p) != ptrs.end() || p == fresh));
  }
  CHECK(f.stat("allocated_bytes.all.current") == static_cast<std::int64_t>(ThreadCache::kFirstBatchBlocks * 4096));
}

TEST_CASE("a batch of mixed sizes and streams refills each bin with its own blocks, statistics exact") {
  // A refill moves the run of blocks of the missed key straight into its bin and stops at the
  // first block of another key; the rest go to their own bins (or the pool) one by one.
  Fixture f;
  std::vector<DevicePtr> small, big, other;  // 1000 B and 3000 B on kStreamA, 1000 B on kStreamB
  for (std::size_t i = 0; i < ThreadCache::kFirstBatchBlocks; ++i) {
    if (i % 4 == 3) {
      big.push_back(f.get(3000, kStreamA));
    } else if (i % 8 == 1) {
      other.push_back(f.get(1000, kStreamB));
    } else {
      small.push_back(f.get(1000, kStreamA));
    }
  }
  // Freed in the order taken: runs of 1000 B on kStreamA broken by the other keys.
  for (std::size_t i = 0, s = 0, b = 0, o = 0; i < ThreadCache::kFirstBatchBlocks; ++i) {
    const DevicePtr p = i % 4 == 3 ? big[b++] : i % 8 == 1 ? other[o++] : small[s++];
    REQUIRE(f.alloc.free(p, FreeOrder::kDevice) == Status::kOk);
  }
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  const auto segments = f.stat("num_device_alloc");
  const auto hits = f.stat("num_cache_hits");
  // Every block comes back to a request of its own key, none twice, from the memory held.
  auto take = [&](std::size_t n, std::size_t bytes, StreamHandle stream) {
    std::set<DevicePtr> got;
    for (std::size_t i = 0; i < n; ++i) got.insert(f.get(bytes, stream));
    CHECK(got.size() == n);
    return got;
  };
  const auto small_again = take(small.size(), 1000, kStreamA);
  const auto big_again = take(big.size(), 3000, kStreamA);
  const auto other_again = take(other.size(), 1000, kStreamB);
  CHECK(small_again == std::set<DevicePtr>(small.begin(), small.end()));
  CHECK(big_again == std::set<DevicePtr>(big.begin(), big.end()));
  CHECK(other_again == std::set<DevicePtr>(other.begin(), other.end()));
  CHECK(f.stat("num_device_alloc") == segments);
  CHECK(f.stat("num_cache_hits") > hits);
  CHECK(f.stat("allocation.all.current") == static_cast<std::int64_t>(ThreadCache::kFirstBatchBlocks));
  CHECK(f.stat("active.all.current") == static_cast<std::int64_t>(ThreadCache::kFirstBatchBlocks));
  CHECK(f.stat("allocated_bytes.all.current") ==
        static_cast<std::int64_t>((small.size() + other.size()) * 1024 + big.size() * 3072));
  CHECK(f.stat("active_bytes.all.current") == f.stat("allocated_bytes.all.current"));
  CHECK(f.stat("inactive_split.all.current") >= 0);
}

TEST_CASE("a loop of cudaMalloc+cudaFree pairs fences batches that grow to kBatchBlocks") {
  // A thread's first batches are small, so that a short loop cycles early on little memory;
  // they double every kGrowAfter batches. One batch is outstanding at a time; its fence is
  // recorded when it closes, and it refills the bin kDepth blocks at a time.
  Fixture f;
  std::size_t growing = 0;  // the pairs of the batches smaller than kBatchBlocks
  std::size_t small_batches = 0;
  for (std::size_t n = ThreadCache::kFirstBatchBlocks; n < ThreadCache::kBatchBlocks; n *= 2) {
    growing += n * ThreadCache::kGrowAfter;
    small_batches += ThreadCache::kGrowAfter;
  }
  for (std::size_t i = 0; i < growing; ++i) f.alloc.free(f.get(4096), FreeOrder::kDevice);
  const auto growing_fences = f.sim.device_fences();
  CHECK(growing_fences >= small_batches - 2);
  CHECK(growing_fences <= small_batches);
  // Full-size batches from here: one fence per kBatchBlocks pairs.
  constexpr std::size_t kBatches = 8;
  for (std::size_t i = 0; i < kBatches * ThreadCache::kBatchBlocks; ++i) {
    f.alloc.free(f.get(4096), FreeOrder::kDevice);
  }
  CHECK(f.sim.device_fences() - growing_fences >= kBatches - 1);
  CHECK(f.sim.device_fences() - growing_fences <= kBatches + 1);
  CHECK(f.sim.segment_calls() == 1);
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  CHECK(f.stat("segment.all.current") == 1);
  // Only the pairs whose batch had not come back yet took the device lock, at most a full
  // batch's worth over the whole loop: the frees all went to the thread's cache.
  INFO("locked allocs " << f.stat("num_locked_allocs"));
  CHECK(f.stat("num_locked_allocs") > 0);
  CHECK(f.stat("num_locked_allocs") <= static_cast<std::int64_t>(ThreadCache::kBatchBlocks + 1));
  CHECK(f.stat("num_locked_frees") == 0);
}

namespace {

// Thread B closes a batch of `blocks` cudaFree'd blocks of `bytes`; the recording of its fence is
// held open (SimOp::kDeviceFence) until release(), as a driver call that takes long. Meanwhile
// the test's thread closes a batch of its own, which B's recording leaves to its next round.
struct HeldFence {
  HeldFence(Fixture& f, std::size_t bytes, std::size_t blocks) : f_(f) {
    f.sim.during_next(SimOp::kDeviceFence, [this] {
      inside = true;
      while (!released) std::this_thread::yield();
    });
    b_ = std::thread([this, bytes, blocks] {
      std::vector<DevicePtr> ptrs;
      for (std::size_t i = 0; i < blocks; ++i) ptrs.push_back(f_.get_in_thread(bytes));
      for (DevicePtr p : ptrs) f_.alloc.free(p, FreeOrder::kDevice);  // the last closes B's batch
    });
    try {  // a failed REQUIRE throws: B is released and joined first
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!inside && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      REQUIRE(inside);  // B's batch closed and its fence is being recorded
      for (std::size_t i = 0; i < blocks; ++i) mine.push_back(f.get(bytes));
      for (DevicePtr p : mine) f.alloc.free(p, FreeOrder::kDevice);
    } catch (...) {
      release();
      throw;
    }
  }
  // Runs `request` on this thread while B's recording is held; a watchdog releases it after
  // `limit` if the request has not returned by then. True if it returned first.
  template <typename F>
  bool returns_before_release(F&& request, std::chrono::milliseconds limit) {
    std::atomic<bool> returned{false};
    std::atomic<bool> fired{false};
    std::thread watchdog([&] {
      const auto until = std::chrono::steady_clock::now() + limit;
      while (!returned && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      if (returned) return;
      fired = true;
      released = true;
    });
    try {
      request();
    } catch (...) {  // a failed REQUIRE: the watchdog is joined first
      returned = true;
      watchdog.join();
      throw;
    }
    returned = true;
    watchdog.join();
    return !fired;
  }
  void release() {
    released = true;
    if (b_.joinable()) b_.join();
  }
  ~HeldFence() { release(); }

  std::vector<DevicePtr> mine;  // the test thread's batch
  std::atomic<bool> inside{false};
  std::atomic<bool> released{false};

 private:
  Fixture& f_;
  std::thread b_;
};

}  // namespace

TEST_CASE("a thread whose next batch waits on another thread's recording takes a block from the pools and keeps its cache") {
  // Before, the thread waited for B's recording (which here never ends on its own).
  Fixture f;
  HeldFence held(f, 4096, ThreadCache::kBatchBlocks);
  const auto locked = f.stat("num_locked_allocs");
  DevicePtr bridged = 0;
  CHECK(held.returns_before_release([&] { bridged = f.get(4096); }, std::chrono::milliseconds(2000)));
  held.release();
  REQUIRE(f.failed_gets == 0);
  CHECK(f.stat("num_bridged_allocs") == 1);
  CHECK(f.stat("num_locked_allocs") == locked + 1);
  CHECK(std::find(held.mine.begin(), held.mine.end(), bridged) == held.mine.end());
  // The thread kept its batch (no drain): B's fence, gone round again, covers it, and it serves
  // the next requests from the thread's cache.
  for (std::size_t i = 0; i < ThreadCache::kDepth; ++i) {
    const DevicePtr p = f.get(4096);
    CHECK(std::find(held.mine.begin(), held.mine.end(), p) != held.mine.end());
  }
  CHECK(f.stat("num_locked_allocs") == locked + 1);
  CHECK(f.stat("num_bridged_allocs") == 1);
}

TEST_CASE("a thread takes at most a batch's blocks or bytes from the pools before it waits for another thread's recording") {
  // 1 MiB blocks: a batch closes at kBatchBytes, 16 blocks, and the bridges stop at as many.
  // 4 KiB blocks: at kBatchBlocks, 256 blocks (1 MiB).
  const std::size_t kBlock = GENERATE(as<std::size_t>{}, 1024 * 1024, 4096);
  const std::size_t kBlocks = std::min(ThreadCache::kBatchBytes / kBlock, ThreadCache::kBatchBlocks);
  CAPTURE(kBlock, kBlocks);
  Fixture f;
  HeldFence held(f, kBlock, kBlocks);
  std::vector<DevicePtr> bridged;
  CHECK(held.returns_before_release(
      [&] {
        for (std::size_t i = 0; i < kBlocks; ++i) bridged.push_back(f.get(kBlock));
      },
      std::chrono::milliseconds(2000)));
  CHECK(f.stat("num_bridged_allocs") == static_cast<std::int64_t>(kBlocks));
  // The next one waits for B's recording, as before, and is then served from the thread's batch.
  DevicePtr next = 0;
  CHECK_FALSE(held.returns_before_release([&] { next = f.get(kBlock); }, std::chrono::milliseconds(200)));
  held.release();
  REQUIRE(f.failed_gets == 0);
  CHECK(f.stat("num_bridged_allocs") == static_cast<std::int64_t>(kBlocks));
  CHECK(std::find(held.mine.begin(), held.mine.end(), next) != held.mine.end());
  for (DevicePtr p : bridged) CHECK(std::find(held.mine.begin(), held.mine.end(), p) == held.mine.end());
  // The context's end empties the thread's pipeline, and with it the count: it bridges again.
  f.alloc.forget_all();
  HeldFence again(f, kBlock, kBlocks);
  CHECK(again.returns_before_release([&] { f.get(kBlock); }, std::chrono::milliseconds(2000)));
  again.release();
  REQUIRE(f.failed_gets == 0);
}

TEST_CASE("a small miss leaves other threads' caches alone unless memory is short") {
  // Thread A fills a small segment and cudaFrees it all: its blocks wait in A's batches. Then
  // this thread misses. With room for a new segment it cuts one and A keeps its batches (A
  // gets its own blocks back); under a limit with no room, A's blocks serve this thread.
  for (const bool short_of_memory : {false, true}) {
    CAPTURE(short_of_memory);
    AllocatorOptions o;
    if (short_of_memory) o.memory_limit_bytes = 2 * kMiB;
    Fixture f(o);
    constexpr std::size_t kBlocks = 2 * kMiB / 4096;
    std::set<DevicePtr> of_a;
    std::atomic<int> step{0};
    DevicePtr a_again = 0;
    std::thread a_thread([&] {
      for (std::size_t i = 0; i < kBlocks; ++i) of_a.insert(f.get_in_thread(4096));
      for (DevicePtr p : of_a) f.alloc.free(p, FreeOrder::kDevice);
      step = 1;
      while (step != 2) std::this_thread::yield();
      a_again = f.get_in_thread(4096);
    });
    while (step != 1) std::this_thread::yield();
    CHECK(f.sim.segment_calls() == 1);
    const DevicePtr mine = f.get(4096);
    step = 2;
    a_thread.join();
    REQUIRE(f.failed_gets == 0);
    if (short_of_memory) {
      CHECK(f.sim.segment_calls() == 1);
      CHECK(of_a.count(mine) == 1);
    } else {
      CHECK(f.sim.segment_calls() == 2);
      CHECK(of_a.count(mine) == 0);
      CHECK(of_a.count(a_again) == 1);  // from A's own batch, fenced when A needed it
    }
    CHECK(a_again != mine);
  }
}

TEST_CASE("threads' batches are fenced when they close, and their refills record no more fences") {
  Fixture f;
  constexpr int kThreads = 4;
  std::vector<std::vector<DevicePtr>> mine(kThreads);
  std::vector<std::thread> ts;
  std::atomic<int> allocated{0};
  std::atomic<int> closed{0};
  std::atomic<bool> go{false};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<DevicePtr> ptrs;
      for (std::size_t i = 0; i < ThreadCache::kFirstBatchBlocks; ++i) ptrs.push_back(f.get_in_thread(8192));
      // A thread that cuts a new segment first takes the others' unbatched frees into the
      // allocator's epoch: every thread allocates before any frees, so each closes a batch.
      allocated++;
      while (allocated < kThreads) std::this_thread::yield();
      for (DevicePtr p : ptrs) f.alloc.free(p, FreeOrder::kDevice);
      closed++;
      while (!go) std::this_thread::yield();
      for (std::size_t i = 0; i < ThreadCache::kFirstBatchBlocks; ++i) mine[t].push_back(f.get_in_thread(8192));
    });
  }
  while (closed < kThreads) std::this_thread::yield();
  // One fence a batch at most; fewer where a batch closed while another thread was recording
  // (that thread's fence covers it: test_fence_clock.cpp).
  const auto fences = f.sim.device_fences();
  CHECK(fences >= 1);
  CHECK(fences <= static_cast<std::size_t>(kThreads));
  const auto locked = f.stat("num_locked_allocs");
  go = true;
  for (auto& th : ts) th.join();
  REQUIRE(f.failed_gets == 0);
  CHECK(f.sim.device_fences() == fences);
  std::set<DevicePtr> all;
  for (auto& v : mine) all.insert(v.begin(), v.end());
  CHECK(all.size() == kThreads * ThreadCache::kFirstBatchBlocks);  // no block handed out twice
  CHECK(f.stat("num_locked_allocs") == locked);  // every refill found its batch past its fence
}

TEST_CASE("freed neighbours coalesce into one block") {
  AllocatorOptions o;
  o.thread_cache = false;  // blocks parked in a thread cache coalesce only when drained
  Fixture f(o);
  DevicePtr a = f.get(512 * kKiB);
  DevicePtr b = f.get(512 * kKiB);
  DevicePtr c = f.get(512 * kKiB);
  DevicePtr d = f.get(512 * kKiB);
  CHECK(f.sim.segment_calls() == 1);
  f.alloc.free(b, FreeOrder::kCompleted);
  f.alloc.free(d, FreeOrder::kCompleted);
  CHECK(f.stat("inactive_split.all.current") == 2);
  CHECK(f.stat("inactive_split_bytes.all.current") == static_cast<std::int64_t>(kMiB));
  f.alloc.free(c, FreeOrder::kCompleted);  // merges b, c and d
  CHECK(f.stat("inactive_split.all.current") == 1);
  CHECK(f.get(kMiB) == b);  // the merged 1.5 MiB block is the best fit
  f.alloc.free(b, FreeOrder::kCompleted);
  f.alloc.free(a, FreeOrder::kCompleted);
  CHECK(f.stat("inactive_split.all.current") == 0);
  CHECK(f.stat("inactive_split_bytes.all.current") == 0);
  CHECK(f.get(kMiB) == a);  // the whole segment is one block again
  CHECK(f.sim.segment_calls() == 1);
}

TEST_CASE("large requests: 20 MiB segments below 10 MiB, 2 MiB rounding above") {
  Fixture f;
  DevicePtr a = f.get(5 * kMiB);
  CHECK(f.stat("reserved_bytes.large_pool.current") == static_cast<std::int64_t>(20 * kMiB));
  DevicePtr b = f.get(14 * kMiB);  // fits the 15 MiB remainder
  CHECK(b == a + 5 * kMiB);
  CHECK(f.sim.segment_calls() == 1);
  DevicePtr c = f.get(11 * kMiB);
  CHECK(f.sim.segment_calls() == 2);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(32 * kMiB));
  // The 1 MiB left in the first segment is not split off (large pool keeps > 1 MiB only).
  CHECK(f.stat("allocated_bytes.all.current") == static_cast<std::int64_t>(5 * kMiB + 15 * kMiB + 12 * kMiB));
  (void)c;
}

TEST_CASE("max_split_size keeps oversize blocks whole and releases them first") {
  AllocatorOptions o;
  o.max_split_size = 40 * kMiB;
  o.memory_limit_bytes = 180 * kMiB;
  Fixture f(o);
  DevicePtr big = f.get(100 * kMiB);
  f.alloc.free(big, FreeOrder::kCompleted);
  // A smaller request must not carve the oversize block.
  DevicePtr small = f.get(30 * kMiB);
  CHECK(small != big);
  CHECK(f.sim.segment_calls() == 2);
  // An oversize request may use it only if it wastes less than 20 MiB.
  CHECK(f.get(90 * kMiB) == big);
  f.alloc.free(big, FreeOrder::kCompleted);
  DevicePtr other = 0;
  // 70 MiB would waste 30 MiB of the cached 100 MiB block: needs fresh memory, and 30 + 100 +
  // 70 is past the 180 MiB limit, so the oversize block goes back to the device first.
  REQUIRE(f.alloc.allocate(70 * kMiB, kNoStream, &other) == Status::kOk);
  CHECK(f.sim.free_calls() == 1);
  CHECK(f.stat("num_alloc_retries") == 0);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(100 * kMiB));
}

TEST_CASE("the memory limit caps reserved memory: fraction and absolute") {
  SECTION("per_process_memory_fraction") {
    AllocatorOptions o;
    o.per_process_memory_fraction = 0.5;
    SimOptions so;
    so.total_memory = 100 * kMiB;
    Fixture f(o, so);
    CHECK(f.alloc.memory_limit() == 50 * kMiB);
    DevicePtr p = 0;
    CHECK(f.alloc.allocate(50 * kMiB, kNoStream, &p) == Status::kOk);
    CHECK(f.alloc.allocate(2 * kMiB, kNoStream, &p) == Status::kOutOfMemory);
    CHECK(f.sim.used_bytes() <= 50 * kMiB);
  }
  SECTION("memory_limit_mb, the smaller limit wins") {
    AllocatorOptions o;
    o.per_process_memory_fraction = 0.9;
    o.memory_limit_bytes = 30 * kMiB;
    SimOptions so;
    so.total_memory = 100 * kMiB;
    Fixture f(o, so);
    CHECK(f.alloc.memory_limit() == 30 * kMiB);
    std::vector<DevicePtr> ptrs;
    DevicePtr p = 0;
    while (f.alloc.allocate(kMiB, kNoStream, &p) == Status::kOk) ptrs.push_back(p);
    CHECK(ptrs.size() == 30);
    CHECK(f.stat("reserved_bytes.all.peak") == static_cast<std::int64_t>(30 * kMiB));
  }
  SECTION("set_memory_limit overrides until reset") {
    Fixture f;
    f.alloc.set_memory_limit(4 * kMiB);
    DevicePtr p = 0;
    CHECK(f.alloc.allocate(5 * kMiB, kNoStream, &p) == Status::kOutOfMemory);
    f.alloc.set_memory_limit(0);
    CHECK(f.alloc.allocate(5 * kMiB, kNoStream, &p) == Status::kOk);
  }
}

TEST_CASE("the out-of-memory ladder releases idle segments, retries, then reports") {
  AllocatorOptions o;
  o.memory_limit_bytes = 40 * kMiB;
  Fixture f(o);
  // Fill the limit with cached segments of another stream.
  DevicePtr a = f.get(20 * kMiB, kStreamA);
  DevicePtr b = f.get(20 * kMiB, kStreamA);
  f.alloc.free(a, FreeOrder::kStream, kStreamA);
  f.alloc.free(b, FreeOrder::kStream, kStreamA);
  f.sim.enqueue(kStreamA);  // A is busy: its segments cannot be adopted without waiting
  DevicePtr c = f.get(30 * kMiB, kStreamB);
  CHECK(f.stat("num_alloc_retries") == 1);
  CHECK(f.stat("num_device_free") == 2);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(30 * kMiB));

  DevicePtr d = 0;
  CHECK(f.alloc.allocate(12 * kMiB, kStreamB, &d) == Status::kOutOfMemory);
  CHECK(d == 0);
  CHECK(f.stat("num_ooms") == 1);
  auto report = f.alloc.last_oom();
  REQUIRE(report.has_value());
  CHECK(report->requested == 12 * kMiB);
  CHECK(report->rounded == 12 * kMiB);
  CHECK(report->limit == 40 * kMiB);
  CHECK(report->allocated == 30 * kMiB);
  CHECK(report->reserved == 30 * kMiB);
  const std::string msg = report->message();
  CHECK(msg.find("Tried to allocate 12.00 MiB") != std::string::npos);
  CHECK(msg.find("30.00 MiB allocated") != std::string::npos);
  // Nothing was lost: the live block is intact and usable.
  CHECK(f.alloc.find(c).has_value());
  CHECK(f.alloc.free(c, FreeOrder::kCompleted) == Status::kOk);
  CHECK(f.alloc.allocate(12 * kMiB, kStreamB, &d) == Status::kOk);
}

TEST_CASE("a backend allocation failure goes down the ladder and the allocator keeps working") {
  SimOptions so;
  so.total_memory = 64 * kMiB;
  Fixture f({}, so);
  DevicePtr cached = f.get(20 * kMiB);
  f.alloc.free(cached, FreeOrder::kCompleted);
  f.sim.fail_after(SimOp::kAllocate, 0);  // the next device allocation fails
  DevicePtr p = f.get(30 * kMiB);         // ladder: release the idle cache, retry
  CHECK(p != 0);
  CHECK(f.stat("num_alloc_retries") == 1);
  f.sim.fail_after(SimOp::kAllocate, 0);
  f.sim.fail_after(SimOp::kAllocate, 0);
  DevicePtr q = 0;
  // Only one failure is armed at a time per op: the retry succeeds.
  CHECK(f.alloc.allocate(4 * kMiB, kNoStream, &q) == Status::kOk);
}

TEST_CASE("garbage collection gives back the longest-idle segments without a fraction set") {
  AllocatorOptions o;
  o.garbage_collection_threshold = 0.5;
  SimOptions so;
  so.total_memory = 100 * kMiB;
  Fixture f(o, so);
  std::vector<DevicePtr> ptrs;
  for (int i = 0; i < 4; ++i) ptrs.push_back(f.get(12 * kMiB));  // 48 MiB reserved
  for (DevicePtr p : ptrs) f.alloc.free(p, FreeOrder::kCompleted);
  DevicePtr keep = f.get(12 * kMiB);  // reuses the first freed (lowest address among equals)
  (void)keep;
  // 48 MiB reserved is below 50: no collection yet.
  DevicePtr x = f.get(14 * kMiB);
  CHECK(f.stat("num_device_free") == 0);
  // Now 62 MiB reserved > 50 MiB: the next new segment first releases idle ones, oldest first.
  DevicePtr y = f.get(16 * kMiB);
  CHECK(f.stat("num_device_free") >= 1);
  CHECK(f.stat("reserved_bytes.all.current") <= static_cast<std::int64_t>(50 * kMiB + 16 * kMiB));
  (void)x;
  (void)y;
}

TEST_CASE("bad frees are refused and leave the cache intact") {
  Fixture f;
  DevicePtr a = f.get(8192);
  std::memset(reinterpret_cast<void*>(a), 0x5a, 8192);
  CHECK(f.alloc.free(a + 512, FreeOrder::kDevice) == Status::kInvalidValue);  // interior
  CHECK(f.alloc.free(0x1234, FreeOrder::kDevice) == Status::kInvalidValue);    // unknown
  CHECK(f.alloc.free(a, FreeOrder::kCompleted) == Status::kOk);
  CHECK(f.alloc.free(a, FreeOrder::kCompleted) == Status::kInvalidValue);  // double free
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  CHECK(f.stat("allocation.all.current") == 0);
  DevicePtr b = f.get(8192);
  CHECK(b == a);
  CHECK(f.stat("allocation.all.current") == 1);
}

TEST_CASE("reset_peak_stats brings every peak down to the current value") {
  Fixture f;
  DevicePtr a = f.get(12 * kMiB);
  DevicePtr b = f.get(4096);
  f.alloc.free(a, FreeOrder::kCompleted);
  CHECK(f.stat("allocated_bytes.all.peak") == static_cast<std::int64_t>(12 * kMiB + 4096));
  f.alloc.reset_peak_stats();
  CHECK(f.stat("allocated_bytes.all.peak") == 4096);
  CHECK(f.stat("reserved_bytes.all.peak") == f.stat("reserved_bytes.all.current"));
  f.alloc.free(b, FreeOrder::kCompleted);
  CHECK(f.stat("allocated_bytes.all.peak") == 4096);
}

TEST_CASE("find describes the block around an interior pointer") {
  Fixture f;
  f.get(1024);
  DevicePtr b = f.get(3000, kNoStream);
  auto info = f.alloc.find(b + 100);
  REQUIRE(info.has_value());
  CHECK(info->base == b);
  CHECK(info->size == 3072);
  CHECK(info->requested == 3000);
  CHECK(info->segment_size == 2 * kMiB);
  CHECK(f.alloc.owns(b + 100));
  CHECK_FALSE(f.alloc.find(b + 3072 + 5).has_value());  // free remainder: not a live block
  CHECK(f.alloc.owns(b + 3072 + 5));
  CHECK_FALSE(f.alloc.owns(0x42));
}

TEST_CASE("each hand-out has a buffer id of its own, kept while it lives") {
  // Plain and expandable segments, with and without the thread caches: the hot path, the
  // locked path's split blocks and whole segments.
  for (const bool expandable : {false, true}) {
    for (const bool cached : {true, false}) {
      INFO("expandable " << expandable << ", thread cache " << cached);
      AllocatorOptions o;
      o.expandable_segments = expandable;
      o.thread_cache = cached;
      Fixture f(o);
      Fixture other(o);  // another context's allocator: its ids are apart from these
      std::set<std::uint64_t> seen;
      auto id_of = [](Fixture& x, DevicePtr p) {
        auto info = x.alloc.find(p);
        REQUIRE(info.has_value());
        CHECK(info->buffer_id >> 63 == 1);  // apart from the driver's own ids
        CHECK(x.alloc.find(p + 1)->buffer_id == info->buffer_id);  // stable while it lives
        return info->buffer_id;
      };
      for (std::size_t n : {std::size_t{4096}, 3 * kMiB, 30 * kMiB}) {
        const DevicePtr a = f.get(n, kStreamA);
        const DevicePtr b = f.get(n, kStreamA);  // same segment as `a` when n is small
        const DevicePtr c = other.get(n, kStreamA);
        CHECK(seen.insert(id_of(f, a)).second);
        CHECK(seen.insert(id_of(f, b)).second);
        CHECK(seen.insert(id_of(other, c)).second);
        for (int round = 0; round < 3; ++round) {
          REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA) == Status::kOk);
          CHECK_FALSE(f.alloc.find(a).has_value());
          REQUIRE(f.get(n, kStreamA) == a);  // the same block, a new hand-out
          CHECK(seen.insert(id_of(f, a)).second);
        }
      }
    }
  }
}

TEST_CASE("allocators that share a device budget are bounded together by the limit") {
  // Two contexts of one device: the limit is the process's, whichever allocator holds the
  // memory, plain or expandable; a context's end gives its memory back to the budget.
  TwoContexts two(/*a_expandable=*/false, /*b_expandable=*/true);
  auto& budget = two.budget;
  Fixture &a = two.a, &b = two.b;
  const DevicePtr pa = a.get(40 * kMiB);
  DevicePtr pb = 0;
  CHECK(b.alloc.allocate(40 * kMiB, kNoStream, &pb) == Status::kOutOfMemory);
  CHECK(b.sim.segment_calls() + b.sim.map_calls() == 0);  // refused before the device was asked
  const auto report = b.alloc.last_oom();
  REQUIRE(report.has_value());
  CHECK(report->held_elsewhere == 40 * kMiB);
  CHECK(report->message().find("40.00 MiB held by other contexts on the device") != std::string::npos);
  CHECK(budget->held() == 40 * kMiB);
  // What is left of the limit still serves.
  const DevicePtr small = b.get(20 * kMiB);
  CHECK(budget->held() == 40 * kMiB + b.alloc.stats().reserved_bytes[kStatAll].current);
  // Freed and given back by one, the memory serves the other.
  REQUIRE(a.alloc.free(pa, FreeOrder::kCompleted) == Status::kOk);
  CHECK(a.alloc.release_cached() == 40 * kMiB);
  CHECK(b.alloc.allocate(40 * kMiB, kNoStream, &pb) == Status::kOk);
  // A context's end takes its memory with it.
  REQUIRE(b.alloc.free(small, FreeOrder::kCompleted) == Status::kOk);
  REQUIRE(b.alloc.free(pb, FreeOrder::kCompleted) == Status::kOk);
  b.alloc.forget_all();
  CHECK(budget->held() == 0);
  a.get(60 * kMiB);
  CHECK(budget->held() == static_cast<std::size_t>(a.alloc.stats().reserved_bytes[kStatAll].current));
}

TEST_CASE("a segment's room under a shared limit comes back only once the device took the memory back") {
  // Two contexts of one device under one limit. While one gives idle memory back (a plain
  // segment, or an expandable chunk), the other asks for the same room: the device still
  // holds the memory, so the room is not free yet; and memory the device refuses to take
  // back keeps its room for good.
  const bool expandable = GENERATE(false, true);
  CAPTURE(expandable);
  const SimOp op = expandable ? SimOp::kUnmap : SimOp::kFree;
  TwoContexts two(expandable);
  auto& budget = two.budget;
  Fixture &a = two.a, &b = two.b;
  REQUIRE(a.alloc.free(a.get(40 * kMiB), FreeOrder::kCompleted) == Status::kOk);  // idle in a's cache
  Status during = Status::kOk;
  DevicePtr pb = 0;
  std::size_t on_device = 0;
  a.sim.during_next(op, [&] {
    during = b.alloc.allocate(40 * kMiB, kNoStream, &pb);
    on_device = a.sim.used_bytes() + b.sim.used_bytes();
  });
  SECTION("the device takes it back") {
    a.alloc.release_cached();
    CHECK(a.sim.used_bytes() == 0);
    CHECK(during == Status::kOutOfMemory);
    CHECK(on_device <= TwoContexts::kLimit);
    CHECK(b.alloc.allocate(40 * kMiB, kNoStream, &pb) == Status::kOk);  // now the room is free
  }
  SECTION("the device refuses it") {
    a.sim.fail_after(op, 0);
    a.alloc.release_cached();
    CHECK(a.sim.used_bytes() == 40 * kMiB);
    CHECK(during == Status::kOutOfMemory);
    CHECK(on_device <= TwoContexts::kLimit);
    CHECK(budget->held() == a.sim.used_bytes() + b.sim.used_bytes());
    CHECK(b.alloc.allocate(40 * kMiB, kNoStream, &pb) == Status::kOutOfMemory);
  }
}

TEST_CASE("a segment the backend frees later keeps its room under the limit until then") {
  // The driver backend defers cuMemFree during a stream capture (kDeferred): the device still
  // holds the memory, so neither context of the device may have its room before the backend
  // says it is freed, and an out-of-memory report in between says where the room went.
  TwoContexts two;
  auto& budget = two.budget;
  Fixture &a = two.a, &b = two.b;
  REQUIRE(a.alloc.free(a.get(40 * kMiB), FreeOrder::kCompleted) == Status::kOk);
  a.sim.set_defer_frees(true);
  CHECK(a.alloc.release_cached() == 40 * kMiB);  // out of the cache...
  CHECK(a.stat("reserved_bytes.all.current") == 0);
  CHECK(a.sim.used_bytes() == 40 * kMiB);  // ...but still the device's
  DevicePtr p = 0;
  CHECK(b.alloc.allocate(40 * kMiB, kNoStream, &p) == Status::kOutOfMemory);
  REQUIRE(b.alloc.last_oom().has_value());
  CHECK(b.alloc.last_oom()->held_elsewhere == 40 * kMiB);
  CHECK(a.alloc.allocate(40 * kMiB, kNoStream, &p) == Status::kOutOfMemory);
  REQUIRE(a.alloc.last_oom().has_value());
  CHECK(a.alloc.last_oom()->freeing == 40 * kMiB);
  CHECK(a.alloc.last_oom()->held_elsewhere == 0);
  CHECK(a.alloc.last_oom()->message().find("40.00 MiB given back but not yet freed") != std::string::npos);
  a.sim.finish_deferred_frees();
  CHECK(a.sim.used_bytes() == 0);
  CHECK(budget->held() == 0);
  CHECK(b.alloc.allocate(40 * kMiB, kNoStream, &p) == Status::kOk);
}

TEST_CASE("a segment whose deferred free the device refuses comes back to the pool, counted once") {
  // After a capture the driver backend frees the segments it parked; one the driver refuses
  // then is still the device's: as after a refused plain free, it is an idle segment of the
  // cache again, counted once under the limit, that serves or is given back at a later release.
  TwoContexts two;
  auto& budget = two.budget;
  Fixture& a = two.a;
  const DevicePtr p = a.get(40 * kMiB);
  REQUIRE(a.alloc.free(p, FreeOrder::kCompleted) == Status::kOk);
  a.sim.set_defer_frees(true);
  CHECK(a.alloc.release_cached() == 40 * kMiB);
  a.sim.fail_after(SimOp::kFree, 0);
  a.sim.finish_deferred_frees();  // refused
  CHECK(a.sim.used_bytes() == 40 * kMiB);
  CHECK(budget->held() == 40 * kMiB);
  SECTION("it serves") {
    CHECK(a.get(40 * kMiB) == p);
    CHECK(a.sim.segment_calls() == 1);
    CHECK(a.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(40 * kMiB));
    CHECK(budget->held() == 40 * kMiB);
    REQUIRE(a.alloc.free(p, FreeOrder::kCompleted) == Status::kOk);
  }
  SECTION("a release gives it back") {}
  SECTION("the context ends") {
    a.alloc.forget_all();  // the device took it with the context
    CHECK(budget->held() == 0);
    return;
  }
  CHECK(a.alloc.release_cached() == 40 * kMiB);
  CHECK(a.sim.used_bytes() == 0);
  CHECK(budget->held() == 0);
  CHECK(a.stat("reserved_bytes.all.current") == 0);
  CHECK(a.stat("num_device_free") == 1);
}

TEST_CASE("a reclaimer's memory serves a request before it counts as out of memory") {
  // Two contexts of one device under one limit: the other's idle cache, released by the
  // reclaimer with no lock of the asking allocator held, serves the request, and only a
  // request that still fails is an OOM (once).
  TwoContexts two;
  Fixture &a = two.a, &b = two.b;
  struct Recorder : AllocatorObserver {
    int ooms = 0;
    void on_event(const AllocatorEvent& e) noexcept override { ooms += e.kind == EventKind::kOom; }
  } rec;
  b.alloc.set_observer(&rec);
  int asked = 0;
  b.alloc.set_reclaimer([&] {
    ++asked;
    (void)b.alloc.stats();  // the asking allocator's lock is not held
    return a.alloc.release_cached() != 0;
  });
  REQUIRE(a.alloc.free(a.get(40 * kMiB), FreeOrder::kDevice) == Status::kOk);  // idle in a's cache
  DevicePtr p = 0;
  CHECK(b.alloc.allocate(40 * kMiB, kNoStream, &p) == Status::kOk);
  CHECK(asked == 1);
  CHECK(b.stat("num_ooms") == 0);
  CHECK(rec.ooms == 0);
  CHECK_FALSE(b.alloc.last_oom().has_value());
  // Nothing left to reclaim: one OOM, reported.
  DevicePtr q = 0;
  CHECK(b.alloc.allocate(40 * kMiB, kNoStream, &q) == Status::kOutOfMemory);
  CHECK(asked == 2);
  CHECK(b.stat("num_ooms") == 1);
  CHECK(rec.ooms == 1);
  REQUIRE(b.alloc.last_oom().has_value());
  CHECK(b.alloc.last_oom()->requested == 40 * kMiB);
  // Memory reclaimed that is still not enough: one OOM too, not one per try.
  REQUIRE(a.alloc.free(a.get(10 * kMiB), FreeOrder::kDevice) == Status::kOk);
  CHECK(b.alloc.allocate(40 * kMiB, kNoStream, &q) == Status::kOutOfMemory);
  CHECK(asked == 3);
  CHECK(b.stat("num_ooms") == 2);
  CHECK(rec.ooms == 2);
  b.alloc.set_observer(nullptr);
}

TEST_CASE("a request tried again after the reclaimer counts one retry and one locked allocation") {
  // The reclaimer's try runs the ladder a second time; the statistics count requests, as
  // PyTorch's num_alloc_retries does, not runs of the ladder.
  TwoContexts two;
  Fixture &a = two.a, &b = two.b;
  int asked = 0;
  b.alloc.set_reclaimer([&] {
    ++asked;
    return a.alloc.release_cached() != 0;
  });
  Status want = Status::kOk;
  SECTION("served after the reclaim") {
    REQUIRE(a.alloc.free(a.get(40 * kMiB), FreeOrder::kDevice) == Status::kOk);
  }
  SECTION("still out of memory after the reclaim") {
    REQUIRE(a.alloc.free(a.get(10 * kMiB), FreeOrder::kDevice) == Status::kOk);
    a.get(40 * kMiB);  // live: no release makes room for 40 more
    want = Status::kOutOfMemory;
  }
  const auto before = b.alloc.stats();
  DevicePtr p = 0;
  REQUIRE(b.alloc.allocate(40 * kMiB, kNoStream, &p) == want);
  REQUIRE(asked == 1);
  const auto after = b.alloc.stats();
  CHECK(after.num_alloc_retries == before.num_alloc_retries + 1);
  CHECK(after.num_locked_allocs == before.num_locked_allocs + 1);
  CHECK(after.num_ooms == before.num_ooms + (want == Status::kOutOfMemory ? 1 : 0));
}

TEST_CASE("release_cached returns every idle segment and waits for pending frees") {
  Fixture f;
  DevicePtr live = f.get(12 * kMiB);
  DevicePtr a = f.get(4 * kMiB);
  DevicePtr b = f.get(1000);
  f.sim.enqueue(kStreamA);
  f.alloc.free(a, FreeOrder::kDevice);
  f.alloc.free(b, FreeOrder::kCompleted);
  const std::size_t released = f.alloc.release_cached();
  CHECK(released == 20 * kMiB + 2 * kMiB);
  CHECK(f.sim.queued(kStreamA) == 0);  // the pending free was waited for
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(12 * kMiB));
  CHECK(f.alloc.cached_bytes() == 0);
  CHECK(f.alloc.find(live).has_value());
}

TEST_CASE("release_cached(keep) gives back the longest-idle segments until at most keep is reserved") {
  AllocatorOptions o;
  o.thread_cache = false;  // idle order is the order of the frees, not of a cache drain
  Fixture f(o);
  const DevicePtr live = f.get(12 * kMiB);
  const DevicePtr a = f.get(30 * kMiB);
  const DevicePtr b = f.get(30 * kMiB);
  const DevicePtr c = f.get(30 * kMiB);
  // Each free at a later allocator tick (a locked allocation, here a small one, advances it).
  f.alloc.free(a, FreeOrder::kCompleted);
  f.get(64);
  f.alloc.free(b, FreeOrder::kCompleted);
  f.get(64);
  f.alloc.free(c, FreeOrder::kCompleted);
  REQUIRE(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>((12 + 90 + 2) * kMiB));
  const std::size_t frees_before = f.sim.free_calls();

  // Already at or under keep: nothing happens.
  CHECK(f.alloc.release_cached(200 * kMiB) == 0);
  CHECK(f.sim.free_calls() == frees_before);

  // 104 MiB down to at most 60: a, then b go; c, idle last, stays.
  const std::size_t released = f.alloc.release_cached(60 * kMiB);
  CHECK(released == 60 * kMiB);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>((12 + 30 + 2) * kMiB));
  CHECK_FALSE(f.alloc.owns(a));
  CHECK_FALSE(f.alloc.owns(b));
  CHECK(f.alloc.owns(c));
  CHECK(f.alloc.find(live).has_value());
  // keep 0: everything idle, as empty_cache.
  CHECK(f.alloc.release_cached() == 30 * kMiB);
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(14 * kMiB));
}

TEST_CASE("forget_all drops everything without touching the device") {
  Fixture f;
  DevicePtr a = f.get(4096);
  f.get(5 * kMiB);
  f.alloc.forget_all();
  CHECK(f.sim.free_calls() == 0);
  CHECK_FALSE(f.alloc.owns(a));
  CHECK(f.alloc.free(a, FreeOrder::kDevice) == Status::kInvalidValue);
  CHECK(f.stat("reserved_bytes.all.current") == 0);
  CHECK(f.stat("num_device_alloc") == 2);
  f.get(4096);  // still works
}

TEST_CASE("forget_all tells the observer that every live block and segment went, totals ending at zero") {
  // A context destroyed or reset under the cache: observers (the trace, the sanitizer's NVTX
  // registration) hear of each live block's end before its segment's, with no device call.
  const bool expandable = GENERATE(false, true);
  CAPTURE(expandable);
  struct Recorder : AllocatorObserver {
    std::vector<AllocatorEvent> events;
    void on_event(const AllocatorEvent& e) noexcept override { events.push_back(e); }
  } rec;
  AllocatorOptions o;
  o.expandable_segments = expandable;
  Fixture f(o);
  f.alloc.set_observer(&rec);
  std::map<DevicePtr, std::size_t> live;  // address -> requested
  for (auto [n, s] : {std::pair{std::size_t{1000}, kNoStream}, std::pair{std::size_t{3000}, kStreamA},
                      std::pair{30 * kMiB, kNoStream}, std::pair{5 * kMiB + 7, kStreamA}}) {
    live[f.get(n, s)] = n;
  }
  // Cached memory: in the thread's cache, waiting for a fence, an idle segment.
  REQUIRE(f.alloc.free(f.get(2000, kStreamA), FreeOrder::kStream, kStreamA) == Status::kOk);
  f.sim.enqueue(kStreamB);
  REQUIRE(f.alloc.free(f.get(12 * kMiB, kStreamB), FreeOrder::kStream, kStreamA) == Status::kOk);
  REQUIRE(f.alloc.free(f.get(40 * kMiB), FreeOrder::kCompleted) == Status::kOk);
  std::map<DevicePtr, std::size_t> held;  // segments (or mapped chunks) the device gave
  for (const AllocatorEvent& e : rec.events) {
    if (e.kind == EventKind::kSegmentAlloc) held[e.ptr] = e.requested;
    if (e.kind == EventKind::kSegmentFree) held.erase(e.ptr);
  }
  REQUIRE_FALSE(held.empty());
  const std::size_t frees_before = f.sim.free_calls(), unmaps_before = f.sim.unmap_calls();
  const std::size_t first = rec.events.size();

  f.alloc.forget_all();

  CHECK(f.sim.free_calls() == frees_before);  // the device is not asked
  CHECK(f.sim.unmap_calls() == unmaps_before);
  REQUIRE(rec.events.size() > first);
  std::map<DevicePtr, std::size_t> freed;
  std::size_t allocated = SIZE_MAX, reserved = SIZE_MAX;
  for (std::size_t i = first; i < rec.events.size(); ++i) {
    const AllocatorEvent& e = rec.events[i];
    CAPTURE(i, e.ptr);
    CHECK(e.allocated_after <= allocated);  // the totals only fall
    CHECK(e.reserved_after <= reserved);
    allocated = e.allocated_after;
    reserved = e.reserved_after;
    if (e.kind == EventKind::kFree) {
      // Before its segment's end: a sanitizer's region goes before its heap.
      const auto seg = held.upper_bound(e.ptr);
      CHECK((seg != held.begin() && e.ptr < std::prev(seg)->first + std::prev(seg)->second));
      freed[e.ptr] = e.requested;
    } else {
      REQUIRE(e.kind == EventKind::kSegmentFree);
      CHECK(held.count(e.ptr) == 1);
      CHECK(e.requested == held[e.ptr]);
      held.erase(e.ptr);
    }
  }
  CHECK(freed == live);
  CHECK(held.empty());  // every segment the device gave, reported gone
  CHECK(rec.events.back().allocated_after == 0);
  CHECK(rec.events.back().reserved_after == 0);
  CHECK(f.stat("reserved_bytes.all.current") == 0);
  // The allocator goes on, its totals from zero.
  f.get(4096);
  CHECK(rec.events.back().kind == EventKind::kAlloc);
  CHECK(rec.events.back().allocated_after == 4096);
}

TEST_CASE("an observer sees allocations, frees, segments and OOMs") {
  struct Recorder : AllocatorObserver {
    std::vector<AllocatorEvent> events;
    void on_event(const AllocatorEvent& e) noexcept override { events.push_back(e); }
  } rec;
  AllocatorOptions o;
  o.memory_limit_bytes = 4 * kMiB;
  Fixture f(o);
  f.alloc.set_observer(&rec);
  DevicePtr a = f.get(1000, kStreamA);
  f.alloc.free(a, FreeOrder::kStream, kStreamA, true);
  f.get(1000, kStreamA);
  DevicePtr p = 0;
  f.alloc.allocate(8 * kMiB, kStreamA, &p);
  REQUIRE(rec.events.size() >= 5);
  CHECK(rec.events[0].kind == EventKind::kSegmentAlloc);
  CHECK(rec.events[1].kind == EventKind::kAlloc);
  CHECK_FALSE(rec.events[1].cache_hit);
  CHECK(rec.events[1].requested == 1000);
  CHECK(rec.events[1].rounded == 1024);
  CHECK(rec.events[1].allocated_after == 1024);
  CHECK(rec.events[1].reserved_after == 2 * kMiB);
  CHECK(rec.events[2].kind == EventKind::kFree);
  CHECK(rec.events[2].async);
  CHECK(rec.events[3].kind == EventKind::kAlloc);
  CHECK(rec.events[3].cache_hit);
  CHECK(rec.events.back().kind == EventKind::kOom);
  CHECK(rec.events.back().result == Status::kOutOfMemory);
}

TEST_CASE("only events whose earlier events on the block came from the same thread are marked local") {
  // The trace writer stamps local events without ordering them after other threads' records;
  // a block that crossed threads must never be marked local.
  struct Recorder : AllocatorObserver {
    std::mutex mutex;
    std::vector<std::pair<AllocatorEvent, std::thread::id>> events;
    void on_event(const AllocatorEvent& e) noexcept override {
      std::lock_guard lock(mutex);
      events.emplace_back(e, std::this_thread::get_id());
    }
    // The local flags of the kAlloc/kFree events of `ptr`, in order.
    std::vector<bool> local_of(DevicePtr ptr) {
      std::lock_guard lock(mutex);
      std::vector<bool> out;
      for (auto& [e, id] : events) {
        if (e.ptr == ptr && (e.kind == EventKind::kAlloc || e.kind == EventKind::kFree)) out.push_back(e.local);
        if (e.kind != EventKind::kAlloc && e.kind != EventKind::kFree) CHECK_FALSE(e.local);
      }
      return out;
    }
  } rec;
  Fixture f;
  f.alloc.set_observer(&rec);
  // This thread: the first allocation comes from the device pool, the next ones from its cache.
  const DevicePtr a = f.get(1000, kStreamA);
  REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA, true) == Status::kOk);
  REQUIRE(f.get(1000, kStreamA) == a);
  REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA, true) == Status::kOk);
  REQUIRE(f.get(1000, kStreamA) == a);
  // {pool alloc, free of a pool block, cache hit, own free, cache hit}
  CHECK(rec.local_of(a) == std::vector<bool>{false, false, true, true, true});
  // Another thread's block, freed here: not local, and the hit that follows on this thread is
  // (its only cause, that free, is this thread's).
  DevicePtr b = 0;
  Status b_freed = Status::kBackendError;
  DevicePtr b_again = 0;
  std::thread other([&] {
    b = f.get_in_thread(3000, kStreamA);
    b_freed = f.alloc.free(b, FreeOrder::kStream, kStreamA, true);
    b_again = f.get_in_thread(3000, kStreamA);  // a hit in that thread's cache
  });
  other.join();
  REQUIRE(f.failed_gets == 0);
  REQUIRE(b_freed == Status::kOk);
  REQUIRE(b_again == b);
  REQUIRE(f.alloc.free(b, FreeOrder::kStream, kStreamA, true) == Status::kOk);
  REQUIRE(f.get(3000, kStreamA) == b);
  CHECK(rec.local_of(b) == std::vector<bool>{false, false, true, false, true});
}

TEST_CASE("cached blocks are served from the thread cache and drained under pressure") {
  AllocatorOptions o;
  o.memory_limit_bytes = 20 * kMiB;
  Fixture f(o);
  DevicePtr a = f.get(3000);
  f.alloc.free(a, FreeOrder::kCompleted);
  CHECK(f.get(3000) == a);  // same rounded size: from the cache
  CHECK(f.stat("num_cache_hits") == 1);
  CHECK(f.stat("num_locked_allocs") == 1);  // the first allocation only
  CHECK(f.stat("num_locked_frees") == 0);
  f.alloc.free(a, FreeOrder::kCompleted);
  // The segment is whole again only once the cache is drained; a request for all of the
  // limit forces that rather than failing.
  DevicePtr big = f.get(20 * kMiB);
  CHECK(big != 0);
  CHECK(f.stat("num_device_free") == 1);  // the 2 MiB small segment was given back
  CHECK(f.stat("allocated_bytes.all.current") == static_cast<std::int64_t>(20 * kMiB));
}

TEST_CASE("frees that find their bin full go to the pools a batch at a time") {
  Fixture f;
  constexpr std::size_t n = ThreadCache::kDepth + 3 * ThreadCache::kSpillBatch;
  std::vector<DevicePtr> blocks;
  for (std::size_t i = 0; i < n; ++i) blocks.push_back(f.get(1000, kStreamA));
  const auto segments = f.stat("num_device_alloc");
  const auto locked_frees = f.stat("num_locked_frees");
  for (DevicePtr p : blocks) REQUIRE(f.alloc.free(p, FreeOrder::kStream, kStreamA, true) == Status::kOk);
  // The bin takes kDepth; each kSpillBatch of the rest took the device lock once.
  CHECK(f.stat("num_locked_frees") == locked_frees + 3);
  CHECK(f.stat("allocation.all.current") == 0);
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  std::set<DevicePtr> again;
  for (std::size_t i = 0; i < n; ++i) again.insert(f.get(1000, kStreamA));
  CHECK(again == std::set<DevicePtr>(blocks.begin(), blocks.end()));
  CHECK(f.stat("num_device_alloc") == segments);
  for (DevicePtr p : again) REQUIRE(f.alloc.free(p, FreeOrder::kStream, kStreamA, true) == Status::kOk);
}

TEST_CASE("the hot paths' fallbacks keep the cache and the statistics exact") {
  Fixture f;
  // Blocks the locked path hands out live in the shared map, not in this thread's table: their
  // frees take the general path, and fill the bin.
  constexpr std::size_t n = ThreadCache::kDepth + 2;
  std::vector<DevicePtr> blocks;
  for (std::size_t i = 0; i < n; ++i) blocks.push_back(f.get(1000, kStreamA));
  const auto segments = f.stat("num_device_alloc");
  for (std::size_t i = 0; i + 1 < n; ++i) {  // the last of these finds the bin full
    REQUIRE(f.alloc.free(blocks[i], FreeOrder::kStream, kStreamA, true) == Status::kOk);
  }
  // A hit is the newest entry of this thread's table; the bin gets full again behind it, so
  // its free on the hot path finds no room and waits in the thread's spill, taking no lock
  // (the spill goes to the pool at the thread's next locked allocation).
  const DevicePtr hit = f.get(1000, kStreamA);
  REQUIRE(f.alloc.free(blocks.back(), FreeOrder::kStream, kStreamA, true) == Status::kOk);
  const auto locked_frees = f.stat("num_locked_frees");
  REQUIRE(f.alloc.free(hit, FreeOrder::kStream, kStreamA, true) == Status::kOk);
  CHECK(f.stat("num_locked_frees") == locked_frees);
  CHECK(f.stat("allocation.all.current") == 0);
  CHECK(f.stat("active.all.current") == 0);
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  CHECK(f.stat("requested_bytes.all.current") == 0);
  CHECK(f.stat("allocation.all.peak") == static_cast<std::int64_t>(n));
  // A double free of a block now in the bins, and of the one in the pool, changes nothing.
  CHECK(f.alloc.free(blocks.front(), FreeOrder::kStream, kStreamA, true) == Status::kInvalidValue);
  CHECK(f.alloc.free(blocks.back(), FreeOrder::kStream, kStreamA, true) == Status::kInvalidValue);
  // Every block serves again, none twice, from the memory already held.
  std::set<DevicePtr> again;
  for (std::size_t i = 0; i < n; ++i) again.insert(f.get(1000, kStreamA));
  CHECK(again == std::set<DevicePtr>(blocks.begin(), blocks.end()));
  CHECK(f.stat("num_device_alloc") == segments);
  CHECK(f.stat("allocation.all.current") == static_cast<std::int64_t>(n));
  for (DevicePtr p : again) REQUIRE(f.alloc.free(p, FreeOrder::kStream, kStreamA, true) == Status::kOk);

  // cudaFree's order reaches the hot path once a batch has been closed (deferred frees go in
  // place, into the capacity a closed batch leaves).
  for (std::size_t i = 0; i <= ThreadCache::kBatchBlocks; ++i) {
    REQUIRE(f.alloc.free(f.get(1000, kStreamA), FreeOrder::kDevice, kStreamA, false) == Status::kOk);
  }
  // An observer attached once the hot path runs hears of its hits and frees.
  struct Recorder : AllocatorObserver {
    std::vector<AllocatorEvent> events;
    void on_event(const AllocatorEvent& e) noexcept override { events.push_back(e); }
  } rec;
  f.alloc.set_observer(&rec);
  const DevicePtr a = f.get(1000, kStreamA);
  REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA, true) == Status::kOk);
  REQUIRE(rec.events.size() == 2);
  CHECK(rec.events[0].kind == EventKind::kAlloc);
  CHECK(rec.events[0].cache_hit);
  CHECK(rec.events[0].requested == 1000);
  CHECK(rec.events[0].rounded == 1024);
  CHECK(rec.events[1].kind == EventKind::kFree);
  CHECK(rec.events[1].ptr == a);
  CHECK(rec.events[1].local);
  CHECK(rec.events[1].allocated_after + 1024 == rec.events[0].allocated_after);
  // The same through cudaFree's order: the block waits for a fence, and the free is heard once.
  const DevicePtr d = f.get(1000, kStreamA);
  REQUIRE(f.alloc.free(d, FreeOrder::kDevice, kStreamA, false) == Status::kOk);
  REQUIRE(rec.events.size() == 4);
  CHECK(rec.events[3].kind == EventKind::kFree);
  CHECK(rec.events[3].ptr == d);
  CHECK(rec.events[3].requested == 1000);
  CHECK(rec.events[3].rounded == 1024);
  CHECK_FALSE(rec.events[3].async);
  CHECK(rec.events[3].local);
  CHECK(rec.events[3].allocated_after + 1024 == rec.events[2].allocated_after);
  CHECK(f.alloc.free(d, FreeOrder::kDevice, kStreamA, false) == Status::kInvalidValue);
  CHECK(rec.events.size() == 4);  // a double free is no event
  f.alloc.set_observer(nullptr);
}

TEST_CASE("another thread's statistics show a hot-path free as soon as it returned") {
  // The fold skips a thread cache whose statistics did not change since its last fold: each
  // round's hit and free must still be folded into the next read, the thread still running.
  Fixture f;
  constexpr int kRounds = 2000;
  std::atomic<int> done{0};  // rounds the worker finished
  std::atomic<int> seen{0};  // rounds the main thread checked
  std::atomic<bool> failed{false};
  std::thread worker([&] {
    DevicePtr first = f.get_in_thread(3000);
    f.alloc.free(first, FreeOrder::kCompleted);
    for (int round = 1; round <= kRounds && !failed; ++round) {
      DevicePtr p = f.get_in_thread(3000);
      if (f.alloc.free(p, FreeOrder::kCompleted) != Status::kOk) failed = true;
      done.store(round, std::memory_order_release);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (seen.load(std::memory_order_acquire) < round && !failed) {
        if (std::chrono::steady_clock::now() > deadline) failed = true;
        std::this_thread::yield();
      }
    }
  });
  int wrong_current = 0, wrong_hits = 0;
  for (int round = 1; round <= kRounds && !failed; ++round) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (done.load(std::memory_order_acquire) < round && !failed) {
      if (std::chrono::steady_clock::now() > deadline) failed = true;
      std::this_thread::yield();
    }
    const auto m = f.alloc.stats().to_map();
    wrong_current += m.at("allocated_bytes.all.current") != 0;
    wrong_hits += m.at("num_cache_hits") != round;
    seen.store(round, std::memory_order_release);
  }
  worker.join();
  CHECK_FALSE(failed);
  CHECK(f.failed_gets == 0);
  CHECK(wrong_current == 0);
  CHECK(wrong_hits == 0);
}

TEST_CASE("a block cached by one thread is freed by another") {
  Fixture f;
  DevicePtr a = f.get(8192);
  Status freed = Status::kBackendError;
  std::thread([&] { freed = f.alloc.free(a, FreeOrder::kCompleted); }).join();
  CHECK(freed == Status::kOk);
  // The freeing thread exited: its cache went back to the pools.
  CHECK(f.get(8192) == a);
  CHECK(f.stat("allocation.all.current") == 1);
  CHECK(f.stat("allocated_bytes.all.current") == 8192);
}

TEST_CASE("a large block freed in stream order by the thread that took it is reused from that thread's bins") {
  Fixture f;
  const DevicePtr a = f.get(kWhole, kStreamA);
  REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA, true) == Status::kOk);
  const auto hits = f.stat("num_cache_hits");
  for (int i = 0; i < 3; ++i) {
    CHECK(f.get(kWhole, kStreamA) == a);
    REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA, true) == Status::kOk);
  }
  CHECK(f.stat("num_cache_hits") - hits == 3);
  CHECK(f.sim.segment_calls() == 1);
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  CHECK(f.stat("active_bytes.large_pool.current") == 0);
  // Parked, it is not live: a second free of it is refused.
  CHECK(f.alloc.free(a, FreeOrder::kStream, kStreamA, true) == Status::kInvalidValue);
  CHECK_FALSE(f.alloc.find(a).has_value());
  // cudaFree'd large blocks wait on the device fence instead: not served before it passes.
  const DevicePtr b = f.get(kWhole, kStreamA);
  REQUIRE(b == a);
  f.sim.enqueue(kStreamB);
  REQUIRE(f.alloc.free(b, FreeOrder::kDevice) == Status::kOk);
  CHECK(f.get(kWhole, kStreamA) != b);
}

TEST_CASE("a large miss gives this thread's parked large blocks back to the pool before cutting memory") {
  Fixture f;
  const DevicePtr a = f.get(kWhole, kStreamA);
  REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA, true) == Status::kOk);
  // Another rounded size misses the bins; the parked 12 MiB block serves it, split.
  CHECK(f.get(8 * kMiB, kStreamA) == a);
  CHECK(f.sim.segment_calls() == 1);
}

TEST_CASE("a large block is parked only by the thread that took it") {
  // A block taken here and freed by a consumer thread goes to the pool, where this thread's
  // next request of another size finds it; parked in the consumer's bins it would not be.
  Fixture f;
  const DevicePtr a = f.get(kWhole, kStreamA);
  std::atomic<int> step{0};
  Status freed = Status::kBackendError;
  std::thread consumer([&] {
    freed = f.alloc.free(a, FreeOrder::kStream, kStreamA, true);
    step = 1;
    while (step != 2) std::this_thread::yield();  // alive: its cache is not retired
  });
  while (step != 1) std::this_thread::yield();
  CHECK(freed == Status::kOk);
  CHECK(f.get(8 * kMiB, kStreamA) == a);
  CHECK(f.sim.segment_calls() == 1);
  step = 2;
  consumer.join();
}

TEST_CASE("a thread parks at most kLargeBytes of large blocks, and gives them up when memory is short") {
  constexpr std::size_t kHalf = ThreadCache::kLargeBytes / 2 + 2 * kMiB;  // two do not fit
  AllocatorOptions o;
  o.memory_limit_bytes = 2 * kHalf;
  Fixture f(o);
  const DevicePtr a = f.get(kHalf, kStreamA);
  const DevicePtr b = f.get(kHalf, kStreamA);
  std::atomic<int> step{0};
  DevicePtr from_other = 0;
  std::thread other([&] {
    while (step != 1) std::this_thread::yield();
    from_other = f.get_in_thread(kHalf, kStreamA);
  });
  REQUIRE(f.alloc.free(a, FreeOrder::kStream, kStreamA, true) == Status::kOk);  // parked
  REQUIRE(f.alloc.free(b, FreeOrder::kStream, kStreamA, true) == Status::kOk);  // past the bound: pool
  step = 1;
  other.join();
  CHECK(from_other == b);  // found in the pool, before any reclaim step
  // The parked one goes to another thread too, once memory is short.
  DevicePtr from_third = 0;
  std::thread([&] { from_third = f.get_in_thread(kHalf, kStreamA); }).join();
  CHECK(f.failed_gets == 0);
  CHECK(from_third == a);
  CHECK(f.sim.segment_calls() == 2);
  CHECK(f.stat("num_ooms") == 0);
}

// Holds the device lock from another thread: that thread's next locked allocation of
// kHoldBytes blocks inside the observer's report of it (made under the lock) until release().
struct DeviceLockHolder {
  static constexpr std::size_t kHoldBytes = 3 * kMiB;
  struct Gate final : AllocatorObserver {
    std::atomic<bool> inside{false};
    std::atomic<bool> open{false};
    void on_event(const AllocatorEvent& e) noexcept override {
      // A new thread's first allocation misses its (empty) cache: reported under the lock.
      if (e.kind != EventKind::kAlloc || e.requested != kHoldBytes) return;
      inside = true;
      while (!open) std::this_thread::yield();
    }
  } gate;
  Fixture& f;
  std::thread holder;
  DevicePtr held = 0;
  explicit DeviceLockHolder(Fixture& fx) : f(fx) {
    f.alloc.set_observer(&gate);
    holder = std::thread([this] { held = f.get_in_thread(kHoldBytes); });
    while (!gate.inside) std::this_thread::yield();
  }
  // Lets the holder go; its block (`held`) stays allocated.
  void release() {
    gate.open = true;
    holder.join();
    f.alloc.set_observer(nullptr);
    REQUIRE(f.failed_gets == 0);
  }
};

TEST_CASE("a cudaFree'd large block freed while another thread holds the device lock waits in its thread's batches") {
  AllocatorOptions o;
  o.free_epoch_bytes = 0;  // a batch per large block
  Fixture f(o);
  const DevicePtr a = f.get(kWhole, kStreamA);
  const auto locked_frees = f.stat("num_locked_frees");
  f.sim.enqueue(kStreamB);  // device work queued before the free: its fence is not passed yet
  DeviceLockHolder lock(f);
  const auto fences = f.sim.device_fences();
  // Were the free to wait for the lock, the holder is let go after a while, and the test fails.
  std::atomic<bool> freed{false}, timed_out{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 200 && !freed; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!freed) {
      timed_out = true;
      lock.gate.open = true;
    }
  });
  REQUIRE(f.alloc.free(a, FreeOrder::kDevice) == Status::kOk);
  freed = true;
  watchdog.join();
  CHECK_FALSE(timed_out);                      // it did not wait for the lock
  CHECK(f.sim.device_fences() == fences + 1);  // its batch's fence, at once
  lock.release();
  constexpr auto kHeld = static_cast<std::int64_t>(DeviceLockHolder::kHoldBytes);
  CHECK(f.stat("num_locked_frees") == locked_frees);
  CHECK(f.stat("allocated_bytes.all.current") == kHeld);
  CHECK(f.stat("active_bytes.large_pool.current") == static_cast<std::int64_t>(kWhole) + kHeld);  // `a` pending
  // Not served before its fence passes: a miss cuts new memory instead.
  const DevicePtr c = f.get(kWhole, kStreamA);
  CHECK(c != a);
  f.sim.run(kStreamB);
  const auto locked_allocs = f.stat("num_locked_allocs");
  CHECK(f.get(kWhole, kStreamA) == a);  // from the batch, through the bins, without the lock
  CHECK(f.stat("num_locked_allocs") == locked_allocs);
  CHECK(f.stat("allocated_bytes.all.current") == static_cast<std::int64_t>(2 * kWhole) + kHeld);
  CHECK(f.stat("active_bytes.all.current") == static_cast<std::int64_t>(2 * kWhole) + kHeld);
  // A block that is not a whole segment still waits for the lock.
  const DevicePtr split = f.get(2 * kMiB, kStreamA);  // from a 20 MiB segment
  DeviceLockHolder again(f);
  std::thread late([&] {
    while (!again.gate.inside) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    again.gate.open = true;
  });
  REQUIRE(f.alloc.free(split, FreeOrder::kDevice) == Status::kOk);  // waited for the lock
  late.join();
  again.release();
  CHECK(f.stat("num_locked_frees") == locked_frees + 1);
  for (DevicePtr p : {a, c, lock.held, again.held}) REQUIRE(f.alloc.free(p, FreeOrder::kDevice) == Status::kOk);
  f.alloc.release_cached();
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  CHECK(f.stat("active_bytes.all.current") == 0);
  CHECK(f.stat("reserved_bytes.all.current") == 0);
}

// Opens a DeviceLockHolder's gate after `ms` unless cancelled first, and says whether it had to:
// a call that should not wait for the device lock then fails its test instead of hanging it.
struct OpenAfter {
  DeviceLockHolder& lock;
  std::atomic<bool> cancelled{false}, fired{false};
  std::thread t;
  OpenAfter(DeviceLockHolder& l, int ms) : lock(l) {
    t = std::thread([this, ms] {
      for (int i = 0; i < ms && !cancelled; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (!cancelled) {
        fired = true;
        lock.gate.open = true;
      }
    });
  }
  bool cancel() {
    cancelled = true;
    t.join();
    return fired;
  }
};

TEST_CASE("under lasting contention a thread's large cudaFree pairs run from its batches, their bytes counted back") {
  AllocatorOptions o;
  o.free_epoch_bytes = 0;
  Fixture f(o);
  std::vector<DevicePtr> pipeline;
  for (int i = 0; i < 4; ++i) pipeline.push_back(f.get(kWhole, kStreamA));
  const auto locked_frees = f.stat("num_locked_frees");
  const auto locked_allocs = f.stat("num_locked_allocs");
  DeviceLockHolder lock(f);
  OpenAfter watchdog(lock, 3000);
  for (DevicePtr p : pipeline) REQUIRE(f.alloc.free(p, FreeOrder::kDevice) == Status::kOk);
  // 100 pairs, 1.2 GiB of frees against a bound of 256 MiB: each must come back off the
  // thread's count as it leaves the batches, or a free would wait for the lock.
  std::set<DevicePtr> seen;
  for (int i = 0; i < 100 && !watchdog.fired; ++i) {
    const DevicePtr p = f.get(kWhole, kStreamA);
    seen.insert(p);
    REQUIRE(f.alloc.free(p, FreeOrder::kDevice) == Status::kOk);
  }
  CHECK_FALSE(watchdog.cancel());
  lock.release();
  CHECK(f.stat("num_locked_frees") == locked_frees);
  CHECK(f.stat("num_locked_allocs") == locked_allocs + 1);  // the holder's own
  CHECK(seen == std::set<DevicePtr>(pipeline.begin(), pipeline.end()));
  REQUIRE(f.alloc.free(lock.held, FreeOrder::kCompleted) == Status::kOk);
  f.alloc.release_cached();
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  CHECK(f.stat("reserved_bytes.all.current") == 0);
}

TEST_CASE("a contended large cudaFree past kLargeHeldBytes takes the lock, and what waited unfenced is fenced first") {
  Fixture f;  // free_epoch_mb 64: a 250 MiB free closes its batch, a 30 MiB one does not
  const std::size_t kBig = 250 * kMiB, kSmaller = 30 * kMiB;
  static_assert(kBig <= ThreadCache::kLargeBytes);  // larger requests never meet a thread's cache
  static_assert(3 * kBig + kSmaller <= ThreadCache::kLargeHeldBytes &&
                4 * kBig + kSmaller > ThreadCache::kLargeHeldBytes);
  const DevicePtr a = f.get(kBig), b = f.get(kBig), e = f.get(kBig), c = f.get(kSmaller), d = f.get(kBig);
  const auto locked_frees = f.stat("num_locked_frees");
  DeviceLockHolder lock(f);
  OpenAfter watchdog(lock, 3000);
  const auto fences = f.sim.device_fences();
  REQUIRE(f.alloc.free(a, FreeOrder::kDevice) == Status::kOk);  // a batch of its own
  REQUIRE(f.alloc.free(b, FreeOrder::kDevice) == Status::kOk);  // another
  REQUIRE(f.alloc.free(e, FreeOrder::kDevice) == Status::kOk);  // another
  REQUIRE(f.alloc.free(c, FreeOrder::kDevice) == Status::kOk);  // deferred, its batch open
  CHECK_FALSE(watchdog.cancel());
  CHECK(f.sim.device_fences() == fences + 3);
  // 780 MiB held: `d` does not fit. It waits for the lock, after `c`'s batch is closed.
  OpenAfter late(lock, 50);
  REQUIRE(f.alloc.free(d, FreeOrder::kDevice) == Status::kOk);
  CHECK(late.cancel());  // it did wait
  lock.release();
  CHECK(f.sim.device_fences() >= fences + 4);
  CHECK(f.stat("num_locked_frees") == locked_frees + 1);
  REQUIRE(f.alloc.free(lock.held, FreeOrder::kCompleted) == Status::kOk);
  f.alloc.release_cached();
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  CHECK(f.stat("reserved_bytes.all.current") == 0);
}

TEST_CASE("memory pressure never hands out a contended large cudaFree'd block before its fence") {
  AllocatorOptions o;
  o.free_epoch_bytes = 0;
  o.memory_limit_bytes = 40 * kMiB;  // `a` and the holder's 20 MiB segment leave no room for another `a`
  Fixture f(o);
  const DevicePtr a = f.get(kWhole, kStreamA);
  f.sim.enqueue(kStreamB);  // work queued before the free
  {
    DeviceLockHolder lock(f);
    OpenAfter watchdog(lock, 3000);
    REQUIRE(f.alloc.free(a, FreeOrder::kDevice) == Status::kOk);
    CHECK_FALSE(watchdog.cancel());
    lock.release();
    REQUIRE(f.alloc.free(lock.held, FreeOrder::kCompleted) == Status::kOk);
  }
  // The pressure drains every thread cache: `a`, its fence not passed, goes to the epoch. If it
  // comes back, the work queued before its free must have run first.
  DevicePtr p = 0;
  const Status st = f.alloc.allocate(kWhole, kStreamA, &p);
  if (st == Status::kOk && p == a) CHECK(f.sim.queued(kStreamB) == 0);
  CHECK((st == Status::kOk || st == Status::kOutOfMemory));
  if (st == Status::kOk) REQUIRE(f.alloc.free(p, FreeOrder::kCompleted) == Status::kOk);
  f.sim.run_all();
  f.alloc.release_cached();
  CHECK(f.stat("allocated_bytes.all.current") == 0);
}

TEST_CASE("a thread defers at most kLargeHeldBytes of cudaFree'd large blocks") {
  ThreadCache cache;
  Segment seg;
  seg.pool = PoolKind::kLarge;
  std::vector<Block> blocks(3);
  for (Block& b : blocks) {
    b.pool = PoolKind::kLarge;
    b.segment = &seg;
    b.size = ThreadCache::kLargeHeldBytes / 2;
  }
  CHECK_FALSE(cache.holds_large_pending());
  for (int i = 0; i < 2; ++i) {
    REQUIRE(cache.may_defer_large(blocks[i].size));
    cache.deferred().push_back(&blocks[i]);
    cache.note_deferred(&blocks[i]);
  }
  CHECK_FALSE(cache.may_defer_large(blocks[2].size));
  CHECK(cache.holds_large_pending());
  CHECK(cache.batch_due(64 * kMiB));  // large deferred bytes past free_epoch_mb close a batch
  // A free_epoch_mb past a quarter of the bound counts as a quarter: else the bound would stop
  // the thread's large frees before any batch of them closed.
  CHECK(cache.batch_due(2 * ThreadCache::kLargeHeldBytes));
  cache.close_batch(1);
  CHECK_FALSE(cache.batch_due(0));  // closing starts the count over; a batch of none is not due
  CHECK_FALSE(cache.may_defer_large(blocks[2].size));  // closed, still held
  cache.left_batches(&blocks[0]);
  CHECK(cache.may_defer_large(blocks[2].size));
  // Below a quarter of the bound, a large free waits for free_epoch_mb's worth.
  Block small_large = blocks[2];
  small_large.size = ThreadCache::kLargeHeldBytes / 8;
  cache.deferred().push_back(&small_large);
  cache.note_deferred(&small_large);
  CHECK(cache.holds_large_deferred());
  CHECK_FALSE(cache.batch_due(ThreadCache::kLargeHeldBytes));
  CHECK(cache.batch_due(ThreadCache::kLargeHeldBytes / 8));
  cache.forget_pending();
  CHECK_FALSE(cache.holds_large_pending());
  CHECK_FALSE(cache.holds_large_deferred());
}

TEST_CASE("threads of large cudaFree pairs, contending for the device lock, never share a byte") {
  Fixture f;
  constexpr int kThreads = 8;
  std::atomic<int> corrupted{0};
  std::atomic<int> failed{0};
  // Reading the statistics takes the device lock: frees find it taken more often than the
  // threads alone make them (on a 2-vCPU machine they seldom run at once).
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done) (void)f.alloc.stats();
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        const std::size_t n = (12 + 2 * ((t + i) % 3)) * kMiB;  // whole segments of 12-16 MiB
        DevicePtr p = 0;
        if (f.alloc.allocate(n, kNoStream, &p) != Status::kOk) {
          ++failed;
          continue;
        }
        auto* words = reinterpret_cast<std::uint64_t*>(p);
        const std::size_t last = n / sizeof(std::uint64_t) - 1;
        const std::uint64_t mark = (static_cast<std::uint64_t>(t) << 32) | static_cast<std::uint64_t>(i);
        words[0] = words[last / 2] = words[last] = mark;
        std::this_thread::yield();  // room for another thread to take the same block, if it could
        if (words[0] != mark || words[last / 2] != mark || words[last] != mark) ++corrupted;
        if (f.alloc.free(p, FreeOrder::kDevice) != Status::kOk) ++failed;
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  reader.join();
  CHECK(corrupted == 0);
  CHECK(failed == 0);
  INFO("locked frees " << f.stat("num_locked_frees") << " of " << kThreads * 300);
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  f.alloc.release_cached();
  CHECK(f.stat("reserved_bytes.all.current") == 0);
  CHECK(f.stat("active_bytes.all.current") == 0);
}

TEST_CASE("a block a thread took from its cache is found and freed from other threads, before and after that thread exits") {
  Fixture f;
  // A cache hit on a thread: the block is recorded in that thread's own table. The thread only
  // records what it saw (Catch2 v2 is not thread-safe); check_hit asserts it on this thread.
  struct Hit {
    DevicePtr first = 0;
    Status freed = Status::kBackendError;
    std::int64_t hits_before = 0;
    DevicePtr again = 0;
    std::int64_t hits_after = 0;
  };
  auto hit_on_this_thread = [&] {
    Hit h;
    h.first = f.get_in_thread(8192);
    h.freed = f.alloc.free(h.first, FreeOrder::kCompleted);
    h.hits_before = f.stat("num_cache_hits");
    h.again = f.get_in_thread(8192);
    h.hits_after = f.stat("num_cache_hits");
    return h;
  };
  auto check_hit = [&](const Hit& h) {
    CHECK(f.failed_gets == 0);
    CHECK(h.freed == Status::kOk);
    CHECK(h.again == h.first);
    CHECK(h.hits_after == h.hits_before + 1);
  };
  Hit live;
  std::atomic<int> step{0};
  std::thread owner([&] {
    live = hit_on_this_thread();
    step = 1;
    while (step != 2) std::this_thread::yield();  // stays alive while the main thread frees
  });
  while (step != 1) std::this_thread::yield();
  check_hit(live);  // CHECK, not REQUIRE: a throw here would leave `owner` unjoined
  const DevicePtr live_thread_block = live.again;
  CHECK(f.alloc.owns(live_thread_block));
  CHECK(f.alloc.record_stream(live_thread_block, kStreamB) == Status::kOk);
  CHECK(f.alloc.free(live_thread_block, FreeOrder::kCompleted) == Status::kOk);
  CHECK(f.alloc.free(live_thread_block, FreeOrder::kCompleted) == Status::kInvalidValue);
  step = 2;
  owner.join();

  Hit orphaned;
  std::thread([&] { orphaned = hit_on_this_thread(); }).join();
  check_hit(orphaned);
  const DevicePtr orphan = orphaned.again;
  // Its thread exited: the block is still live and still this allocator's.
  CHECK(f.alloc.owns(orphan));
  CHECK(f.alloc.free(orphan, FreeOrder::kCompleted) == Status::kOk);
  CHECK(f.alloc.free(orphan, FreeOrder::kCompleted) == Status::kInvalidValue);
  CHECK(f.stat("allocated_bytes.all.current") == 0);
}

TEST_CASE("a pointer of another allocator is refused from any thread and stays live there") {
  Fixture a;
  Fixture b;
  DevicePtr theirs = b.get(8192);
  DevicePtr mine = a.get(8192);
  CHECK(a.alloc.free(theirs, FreeOrder::kCompleted) == Status::kInvalidValue);
  Status refused = Status::kOk;
  std::thread([&] { refused = a.alloc.free(theirs, FreeOrder::kDevice); }).join();
  CHECK(refused == Status::kInvalidValue);
  CHECK(b.stat("allocated_bytes.all.current") == 8192);
  CHECK(b.alloc.free(theirs, FreeOrder::kCompleted) == Status::kOk);
  CHECK(a.alloc.free(mine, FreeOrder::kCompleted) == Status::kOk);
}

TEST_CASE("threads allocating and freeing at once never share a byte") {
  Fixture f;
  constexpr int kThreads = 8;
  std::atomic<int> corrupted{0};
  std::atomic<int> failed_frees{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<DevicePtr, std::size_t>> mine;
      for (int i = 0; i < 2000; ++i) {
        if (mine.size() < 20 && (mine.empty() || rng() % 2)) {
          std::size_t n = 512 + rng() % (64 * 1024);
          DevicePtr p = 0;
          if (f.alloc.allocate(n, kNoStream, &p) != Status::kOk) continue;
          std::memset(reinterpret_cast<void*>(p), t + 1, n);
          mine.emplace_back(p, n);
        } else {
          auto [p, n] = mine.back();
          mine.pop_back();
          const auto* bytes = reinterpret_cast<const unsigned char*>(p);
          for (std::size_t k = 0; k < n; k += 97) {
            if (bytes[k] != t + 1) corrupted++;
          }
          if (f.alloc.free(p, i % 3 == 0 ? FreeOrder::kDevice : FreeOrder::kCompleted) != Status::kOk) failed_frees++;
        }
      }
      for (auto [p, n] : mine) {
        if (f.alloc.free(p, FreeOrder::kCompleted) != Status::kOk) failed_frees++;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(corrupted == 0);
  CHECK(failed_frees == 0);
  CHECK(f.stat("allocated_bytes.all.current") == 0);
}

TEST_CASE("a segment the device refuses to take back stays in the pool, counted, and goes back later") {
  Fixture f;
  const DevicePtr p = f.get(12 * kMiB);
  REQUIRE(f.alloc.free(p, FreeOrder::kCompleted) == Status::kOk);
  f.sim.fail_after(SimOp::kFree, 0);
  f.alloc.release_cached();
  CHECK(f.stat("reserved_bytes.all.current") == static_cast<std::int64_t>(f.sim.used_bytes()));
  CHECK(f.sim.used_bytes() == 12 * kMiB);
  CHECK(f.stat("num_device_free") == 0);
  CHECK(f.get(12 * kMiB) == p);  // still cached, and reusable
  REQUIRE(f.alloc.free(p, FreeOrder::kCompleted) == Status::kOk);
  f.alloc.release_cached();
  CHECK(f.sim.used_bytes() == 0);
  CHECK(f.stat("reserved_bytes.all.current") == 0);
  CHECK(f.stat("num_device_free") == 1);
}

TEST_CASE("forget_all keeps the cache hits and totals the thread caches had not folded in") {
  Fixture f;
  f.alloc.free(f.get(4096, kStreamA), FreeOrder::kStream, kStreamA);
  for (int i = 0; i < 10; ++i) f.alloc.free(f.get(4096, kStreamA), FreeOrder::kStream, kStreamA);
  const auto before = f.alloc.stats();  // folds the caches in
  for (int i = 0; i < 10; ++i) f.alloc.free(f.get(4096, kStreamA), FreeOrder::kStream, kStreamA);
  f.alloc.forget_all();
  const auto after = f.alloc.stats();
  CHECK(after.num_cache_hits == before.num_cache_hits + 10);
}

TEST_CASE("a thread-local destroyed after the thread's caches were handed back still frees and allocates") {
  // Thread-locals are destroyed in the reverse order of their construction: one made before the
  // thread's first allocation (an empty holder, filled later) is destroyed after the allocator's
  // own list of the thread's caches, and its destructor may still free device memory, or
  // allocate. (Before the fix those calls read and grew that destroyed list: heap corruption.)
  Fixture f;
  struct Outcome {
    Status freed = Status::kBackendError;
    Status allocated = Status::kBackendError;
    Status freed_again = Status::kBackendError;
  };
  struct Holder {
    DeviceAllocator* alloc = nullptr;
    Outcome* outcome = nullptr;
    DevicePtr block = 0;
    ~Holder() {
      if (alloc == nullptr) return;
      outcome->freed = alloc->free(block, FreeOrder::kDevice);
      DevicePtr again = 0;
      outcome->allocated = alloc->allocate(4096, kNoStream, &again);
      outcome->freed_again = alloc->free(again, FreeOrder::kCompleted);
    }
  };
  Outcome outcome;
  // What the thread saw, asserted here once it is joined (Catch2 v2 is not thread-safe).
  DevicePtr block = 0;
  Status first_free = Status::kBackendError;
  DevicePtr hit = 0;
  std::thread([&] {
    thread_local Holder holder;  // constructed here, before this thread's cache exists
    holder.alloc = &f.alloc;
    holder.outcome = &outcome;
    holder.block = block = f.get_in_thread(4096);
    // A cache hit: the block lives in this thread's own table.
    first_free = f.alloc.free(holder.block, FreeOrder::kCompleted);
    hit = f.get_in_thread(4096);
  }).join();
  REQUIRE(f.failed_gets == 0);
  REQUIRE(first_free == Status::kOk);
  REQUIRE(hit == block);
  CHECK(outcome.freed == Status::kOk);
  CHECK(outcome.allocated == Status::kOk);
  CHECK(outcome.freed_again == Status::kOk);
  CHECK(f.stat("allocation.all.current") == 0);
  CHECK(f.stat("allocated_bytes.all.current") == 0);
  // Nothing is left behind in a cache no thread owns: everything goes back to the device.
  f.alloc.release_cached();
  CHECK(f.stat("reserved_bytes.all.current") == 0);
  CHECK(f.sim.used_bytes() == 0);
}

TEST_CASE("a request too large to round is out of memory at once, and its report says so in sane units") {
  TwoContexts two;
  Fixture& b = two.b;
  int asked = 0;
  b.alloc.set_reclaimer([&] {
    ++asked;
    return true;
  });
  const DevicePtr sentinel = b.get(kMiB);
  for (std::size_t bytes : {~std::size_t{0}, ~std::size_t{0} - 511, kMaxRoundable + 1}) {
    INFO("bytes " << bytes);
    DevicePtr p = 0;
    CHECK(b.alloc.allocate(bytes, kNoStream, &p) == Status::kOutOfMemory);
    CHECK(p == 0);
    const auto report = b.alloc.last_oom();
    REQUIRE(report.has_value());
    CHECK(report->requested == bytes);
    CHECK(report->rounded == 0);
    const std::string msg = report->message();
    CHECK(msg.find("Tried to allocate " + format_bytes(bytes) + " (more than any device can hold)") != std::string::npos);
    CHECK(msg.find("TiB") == std::string::npos);  // 16 EiB, not millions of TiB
  }
  // Other contexts' caches are not emptied for a request no device could hold; one OOM each.
  CHECK(asked == 0);
  CHECK(b.stat("num_ooms") == 3);
  CHECK(b.alloc.find(sentinel).has_value());
  CHECK(b.alloc.free(sentinel, FreeOrder::kCompleted) == Status::kOk);
}

TEST_CASE("sizes print in the unit that keeps them short, up to EiB") {
  std::size_t unit = 1;
  for (const char* name : {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}) {
    const std::string one = format_bytes(unit);
    CHECK(one == (unit == 1 ? std::string("1 B") : std::string("1.00 ") + name));
    if (unit <= (~std::size_t{0} >> 10)) unit <<= 10;
  }
  const std::string top = format_bytes(~std::size_t{0});
  CHECK(top.substr(top.size() - 3) == "EiB");
  CHECK(std::stod(top) < 1024.0);
}

TEST_CASE("the statistics say what the threads' caches hold, and a thread's cudaFree'd large blocks stay within the bound") {
  Fixture f;
  // Every free has device work queued before it that has not run: what waits piles up as far
  // as the bounds let it, then a miss waits for the oldest batch.
  for (int i = 0; i < 40; ++i) {
    f.sim.enqueue(kStreamA);
    f.alloc.free(f.get(100 * kMiB), FreeOrder::kDevice);
  }
  std::thread other([&] {
    for (int i = 0; i < 10; ++i) f.alloc.free(f.get_in_thread(4096), FreeOrder::kDevice);
  });
  other.join();  // its cache goes back to the allocator when it exits
  MemoryStats s = f.alloc.stats();
  CHECK(s.thread_caches == 1);
  CHECK(s.thread_cache_bytes == s.thread_cache_max_bytes);
  CHECK(s.thread_cache_bytes >= static_cast<std::int64_t>(100 * kMiB));
  CHECK(s.thread_cache_bytes <= static_cast<std::int64_t>(ThreadCache::kLargeHeldBytes + ThreadCache::kLargeBytes));
  CHECK(s.reserved_bytes[kStatAll].peak <= static_cast<std::int64_t>(ThreadCache::kLargeHeldBytes + 3 * 100 * kMiB));
  CHECK(s.num_pending_waits > 0);
  f.alloc.release_cached();
  s = f.alloc.stats();
  CHECK(s.thread_cache_bytes == 0);
}

TEST_CASE("a thread that keeps getting one split large block back cycles its size without the device lock") {
  Fixture f;
  const std::size_t kSplit = 4 * kMiB;  // cut from a larger segment: not a whole segment
  for (int i = 0; i < 200; ++i) f.alloc.free(f.get(kSplit), FreeOrder::kDevice);
  // Its first frees went through the lock (the block came back from the epoch); from the third
  // free of the same block on, they wait in the thread's batches, a fence per batch.
  CHECK(f.stat("num_locked_frees") <= 3);
  CHECK(f.sim.device_fences() < 50);
  // Frees of split blocks of varied sizes keep the epoch's coalescing: all through the lock.
  const auto locked = f.stat("num_locked_frees");
  std::vector<DevicePtr> varied;
  for (int i = 0; i < 20; ++i) varied.push_back(f.get((2 + i % 5) * kMiB));
  for (DevicePtr p : varied) f.alloc.free(p, FreeOrder::kDevice);
  CHECK(f.stat("num_locked_frees") - locked == 20);
}
