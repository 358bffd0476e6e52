// The pinned host memory cache on its own, over a backend whose fences complete when the test
// says so.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "allocator/host_cache.h"

using namespace cudalloc;

namespace {

struct TestFence final : Fence {
  explicit TestFence(std::shared_ptr<bool> d) : done_(std::move(d)) {}
  bool done() override { return *done_; }
  bool wait() override {
    *done_ = true;  // the "device" finishes when waited for
    return true;
  }
  std::shared_ptr<bool> done_;
};

class TestBackend final : public HostBackend {
 public:
  // What a test left allocated goes with it, as pinned memory goes with its process.
  ~TestBackend() override {
    for (const auto& entry : live) std::free(entry.first);
  }
  // The cache calls these from any thread (its size classes lock apart), as it would the driver.
  Status allocate(std::size_t bytes, unsigned flags, void** out) override {
    std::lock_guard lock(mutex);
    if (fail_next) {
      fail_next = false;
      return Status::kOutOfMemory;
    }
    void* p = std::aligned_alloc(4096, bytes);
    live[p] = {bytes, flags};
    ++allocs;
    *out = p;
    return Status::kOk;
  }
  Status free(void* p) override {
    std::lock_guard lock(mutex);
    auto it = live.find(p);
    if (it == live.end()) return Status::kInvalidValue;
    live.erase(it);
    std::free(p);
    ++frees;
    return Status::kOk;
  }
  std::unique_ptr<Fence> record_fence() override {
    std::lock_guard lock(mutex);
    ++fences;
    auto d = std::make_shared<bool>(fences_done);
    last = d;
    return std::make_unique<TestFence>(d);
  }
  struct Alloc {
    std::size_t bytes;
    unsigned flags;
  };
  std::map<void*, Alloc> live;
  int allocs = 0, frees = 0, fences = 0;
  bool fences_done = true;  // a fence recorded now is already done (an idle device)
  bool fail_next = false;
  std::shared_ptr<bool> last;
  std::mutex mutex;
};

struct Fixture {
  TestBackend backend;
  HostBudget budget;
  HostCache cache{backend, budget, 0};
};

void* alloc(HostCache& c, std::size_t n, unsigned flags = 0, bool* hit = nullptr) {
  void* p = nullptr;
  REQUIRE(c.allocate(n, flags, &p, hit) == Status::kOk);
  REQUIRE(p != nullptr);
  return p;
}

}  // namespace

TEST_CASE("size classes: powers of two up to 1 MiB, quarter steps above") {
  CHECK(!HostCache::class_of(0));
  CHECK(HostCache::class_size(*HostCache::class_of(1)) == 4096);
  CHECK(HostCache::class_size(*HostCache::class_of(4096)) == 4096);
  CHECK(HostCache::class_size(*HostCache::class_of(4097)) == 8192);
  CHECK(HostCache::class_size(*HostCache::class_of(kMiB)) == kMiB);
  CHECK(HostCache::class_size(*HostCache::class_of(kMiB + 1)) == kMiB + kMiB / 4);
  CHECK(HostCache::class_size(*HostCache::class_of(3 * kMiB)) == 3 * kMiB);
  CHECK(HostCache::class_size(*HostCache::class_of(3 * kMiB + 1)) == 3 * kMiB + kMiB / 2);
  CHECK(HostCache::class_size(*HostCache::class_of(4 * kMiB)) == 4 * kMiB);
  CHECK(HostCache::class_size(*HostCache::class_of(HostCache::kMaxRequest)) == HostCache::kMaxRequest);
  CHECK(!HostCache::class_of(HostCache::kMaxRequest + 1));
  // Every size fits its class, and the class wastes at most a quarter above 1 MiB.
  for (std::size_t n : {std::size_t{1}, std::size_t{5000}, kMiB - 1, kMiB + 7, 5 * kMiB + 3, 100 * kMiB + 1, 3 * kGiB}) {
    const std::size_t s = HostCache::class_size(*HostCache::class_of(n));
    CHECK(s >= n);
    if (n > kMiB) CHECK(s - n <= n / 4);
  }
  CHECK(HostCache::segment_size(4096) == 64 * kKiB);
  CHECK(HostCache::segment_size(128 * kKiB) == 2 * kMiB);
  CHECK(HostCache::segment_size(256 * kKiB) == 256 * kKiB);
  CHECK(!HostCache::cacheable(4096, 0x8));
}

TEST_CASE("a pair loop is served from one segment") {
  Fixture f;
  bool hit = true;
  void* first = alloc(f.cache, 3 * kMiB, 0, &hit);
  CHECK(!hit);
  CHECK(f.cache.free(first) == HostCache::Lookup::kLive);
  for (int i = 0; i < 100; ++i) {
    void* p = alloc(f.cache, 3 * kMiB, 0, &hit);
    CHECK(hit);
    CHECK(p == first);
    CHECK(f.cache.free(p) == HostCache::Lookup::kLive);
  }
  CHECK(f.backend.allocs == 1);
  const HostCacheStats s = f.cache.stats();
  CHECK(s.allocations == 101);
  CHECK(s.hits == 100);
  CHECK(s.misses == 1);
  CHECK(s.in_use_bytes == 0);
  CHECK(s.reserved_bytes == 3 * kMiB);
}

TEST_CASE("small blocks come 16 to a segment, page-aligned") {
  Fixture f;
  std::set<void*> seen;
  for (int i = 0; i < 16; ++i) {
    void* p = alloc(f.cache, 100);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
    seen.insert(p);
  }
  CHECK(seen.size() == 16);
  CHECK(f.backend.allocs == 1);
  alloc(f.cache, 100);
  CHECK(f.backend.allocs == 2);
}

TEST_CASE("flag sets never share blocks") {
  Fixture f;
  std::map<unsigned, void*> by_flags;
  // Blocks of a segment of their own: a request gets exactly the block its flag set freed.
  for (unsigned flags = 0; flags < 8; ++flags) by_flags[flags] = alloc(f.cache, 512 * kKiB, flags);
  CHECK(f.backend.allocs == 8);
  for (auto& [flags, p] : by_flags) {
    CHECK(f.backend.live.at(p).flags == flags);  // each its own segment, made with its flags
    CHECK(f.cache.free(p) == HostCache::Lookup::kLive);
  }
  for (unsigned flags = 0; flags < 8; ++flags) {
    void* p = alloc(f.cache, 512 * kKiB, flags);
    CHECK(p == by_flags[flags]);
    HostBlockInfo info;
    REQUIRE(f.cache.find(p, &info) == HostCache::Lookup::kLive);
    CHECK(info.flags == flags);
  }
  CHECK(f.backend.allocs == 8);
  // Small blocks: the other blocks of a flag set's segment, never another flag set's.
  std::map<void*, unsigned> small;
  for (unsigned flags = 0; flags < 8; ++flags) {
    for (int i = 0; i < 20; ++i) small[alloc(f.cache, 8192, flags)] = flags;
  }
  for (auto& [p, flags] : small) {
    HostBlockInfo info;
    REQUIRE(f.cache.find(p, &info) == HostCache::Lookup::kLive);
    CHECK(info.flags == flags);
    CHECK(f.backend.live.at(info.segment_base).flags == flags);
  }
}

TEST_CASE("a freed block waits for its fence") {
  Fixture f;
  f.backend.fences_done = false;  // the device is busy
  void* a = alloc(f.cache, 2 * kMiB);
  CHECK(f.cache.free(a) == HostCache::Lookup::kLive);
  CHECK(f.backend.fences == 0);  // the free records nothing
  void* b = alloc(f.cache, 2 * kMiB);
  CHECK(b != a);  // not reused: the fence is not done
  CHECK(f.backend.fences == 1);
  CHECK(f.backend.allocs == 2);
  *f.backend.last = true;  // the device got past the free
  bool hit = false;
  void* c = alloc(f.cache, 2 * kMiB, 0, &hit);
  CHECK(c == a);
  CHECK(hit);
  CHECK(f.cache.stats().fenced_hits == 1);
}

TEST_CASE("bad frees change nothing") {
  Fixture f;
  char* p = static_cast<char*>(alloc(f.cache, 64 * kKiB));
  int other = 0;
  CHECK(f.cache.free(&other) == HostCache::Lookup::kNotOwned);
  CHECK(f.cache.free(p + 16) == HostCache::Lookup::kFreed);  // interior
  CHECK(f.cache.free(p + 64 * kKiB) == HostCache::Lookup::kFreed);  // a ready block of the segment
  HostBlockInfo info;
  REQUIRE(f.cache.find(p + 100, &info) == HostCache::Lookup::kLive);
  CHECK(info.base == p);
  CHECK(info.size == 64 * kKiB);
  CHECK(info.requested == 64 * kKiB);
  CHECK(info.segment_size == HostCache::segment_size(64 * kKiB));
  CHECK(f.cache.free(p) == HostCache::Lookup::kLive);
  CHECK(f.cache.free(p) == HostCache::Lookup::kFreed);  // double free
  CHECK(f.cache.find(p, &info) == HostCache::Lookup::kFreed);
  CHECK(f.cache.stats().frees == 1);
}

TEST_CASE("buffer ids are unique per hand-out") {
  Fixture f;
  void* p = alloc(f.cache, 512 * kKiB);
  HostBlockInfo a, b;
  REQUIRE(f.cache.find(p, &a) == HostCache::Lookup::kLive);
  REQUIRE(f.cache.find(p, &b) == HostCache::Lookup::kLive);
  CHECK(a.buffer_id == b.buffer_id);
  f.cache.free(p);
  REQUIRE(alloc(f.cache, 512 * kKiB) == p);
  REQUIRE(f.cache.find(p, &b) == HostCache::Lookup::kLive);
  CHECK(a.buffer_id != b.buffer_id);
}

TEST_CASE("release gives back idle segments, waiting for fences") {
  Fixture f;
  f.backend.fences_done = false;
  void* a = alloc(f.cache, 5 * kMiB);
  void* b = alloc(f.cache, 4096);
  f.cache.free(a);
  CHECK(f.cache.release_cached(false) == 0);  // a's fence is not even recorded
  CHECK(f.cache.release_cached(true) == 5 * kMiB);
  CHECK(f.backend.frees == 1);
  CHECK(f.backend.live.count(a) == 0);
  CHECK(f.cache.owns(b));
  CHECK(!f.cache.owns(a));
  f.cache.free(b);
  CHECK(f.cache.release_cached(true) == 64 * kKiB);
  CHECK(f.cache.stats().reserved_bytes == 0);
  CHECK(f.budget.held() == 0);
}

TEST_CASE("the limit: idle memory goes first, then the request fails") {
  Fixture f;
  f.budget.set_limit(8 * kMiB);
  void* a = alloc(f.cache, 5 * kMiB);
  f.cache.free(a);
  void* b = alloc(f.cache, 6 * kMiB);  // 5 + 6 > 8: the idle 5 MiB is given back first
  CHECK(f.backend.live.count(a) == 0);
  CHECK(f.budget.held() == 6 * kMiB);
  void* c = nullptr;
  CHECK(f.cache.allocate(4 * kMiB, 0, &c) == Status::kOutOfMemory);
  CHECK(f.cache.stats().ooms == 1);
  CHECK(f.cache.free(b) == HostCache::Lookup::kLive);
}

TEST_CASE("host out of memory: the cache is given back and the request retried") {
  Fixture f;
  void* a = alloc(f.cache, 2 * kMiB);
  f.cache.free(a);
  f.backend.fail_next = true;
  alloc(f.cache, 7 * kMiB);
  CHECK(f.backend.live.count(a) == 0);
  CHECK(f.backend.frees == 1);
}

TEST_CASE("forget_all drops everything without the backend") {
  Fixture f;
  void* a = alloc(f.cache, 2 * kMiB);
  alloc(f.cache, 4096);
  f.cache.forget_all();
  CHECK(f.backend.frees == 0);
  CHECK(!f.cache.owns(a));
  CHECK(f.cache.free(a) == HostCache::Lookup::kNotOwned);
  CHECK(f.budget.held() == 0);
  for (auto& [p, _] : f.backend.live) std::free(p);
  f.backend.live.clear();
}

TEST_CASE("threads pairing on their own classes and sharing one") {
  Fixture f;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&f, t] {
      for (int i = 0; i < 2000; ++i) {
        void* p = nullptr;
        const std::size_t n = (i % 2 == 0) ? 4096 : 4096u << t;
        if (f.cache.allocate(n, 0, &p) != Status::kOk) std::abort();
        static_cast<char*>(p)[0] = static_cast<char>(i);
        if (f.cache.free(p) != HostCache::Lookup::kLive) std::abort();
      }
    });
  }
  for (auto& th : threads) th.join();
  const HostCacheStats s = f.cache.stats();
  CHECK(s.allocations == 8000);
  CHECK(s.frees == 8000);
  CHECK(s.in_use_blocks == 0);
}
