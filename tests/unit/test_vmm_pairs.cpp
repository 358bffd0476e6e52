// The cache of the program's own virtual memory pairs on its own: the decisions it makes for
// each call and the real calls it asks for, with fences that complete when the test says so.
#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <vector>

#include "allocator/vmm_pairs.h"

using namespace cudalloc;

namespace {

constexpr std::size_t kMiB2 = 2 * kMiB;

struct TestFence final : Fence {
  explicit TestFence(std::shared_ptr<bool> d) : done_(std::move(d)) {}
  bool done() override { return *done_; }
  bool wait() override { return *done_ = true; }
  std::shared_ptr<bool> done_;
};

// A program and a driver: misses get fresh ranges and handles, as the driver would give them.
struct Fixture {
  int fences = 0;
  bool device_idle = true;  // a fence recorded now is done at once
  std::vector<std::shared_ptr<bool>> recorded;
  VmmPairs cache{0, [this] {
    ++fences;
    recorded.push_back(std::make_shared<bool>(device_idle));
    return std::make_unique<TestFence>(recorded.back());
  }};
  VmAddress next_va = 0x7000'0000'0000;
  VmHandle next_handle = 100;
  int real_reserves = 0, real_creates = 0, real_calls = 0;

  void finish_device_work() {
    for (auto& d : recorded) *d = true;
  }
  VmAddress reserve(std::size_t size, std::size_t alignment = 0) {
    if (auto a = cache.lend_range(size, alignment)) return *a;
    ++real_reserves;
    const VmAddress va = next_va;
    next_va += size + 64 * kMiB;
    cache.note_reserved(va, size);
    return va;
  }
  VmHandle create(std::size_t size) {
    if (auto h = cache.lend_handle(size)) return *h;
    ++real_creates;
    const VmHandle h = next_handle++;
    cache.note_created(h, size);
    return h;
  }
  // Returns the real calls asked for before the driver's; counts the driver's call.
  std::vector<VmOp> map(VmAddress va, std::size_t size, VmHandle h, std::size_t offset = 0) {
    VmDecision d = cache.map(va, size, offset, h);
    if (!d.served) {
      ++real_calls;
      cache.note_mapped(va, size, offset, h);
    }
    return d.settle;
  }
  std::vector<VmOp> access(VmAddress va, std::size_t size, std::uint64_t flags = 3) {
    const VmAccess a{0x1'0000'0000, flags};
    VmDecision d = cache.set_access(va, size, std::span<const VmAccess>(&a, 1));
    if (!d.served) {
      ++real_calls;
      cache.note_access(va, size, std::span<const VmAccess>(&a, 1));
    }
    return d.settle;
  }
  std::vector<VmOp> decided(VmDecision d) {
    real_calls += !d.served;
    return d.settle;
  }
  // An XLA buffer: reserve, create, map, set access.
  std::pair<VmAddress, VmHandle> buffer(std::size_t size) {
    const VmAddress va = reserve(size);
    const VmHandle h = create(size);
    REQUIRE(map(va, size, h).empty());
    REQUIRE(access(va, size).empty());
    return {va, h};
  }
  void free_buffer(std::pair<VmAddress, VmHandle> b, std::size_t size) {
    REQUIRE(decided(cache.unmap(b.first, size)).empty());
    REQUIRE(decided(cache.release(b.second)).empty());
    REQUIRE(decided(cache.address_free(b.first, size)).empty());
  }
};

// A buffer made and given back: a cached pair.
std::pair<VmAddress, VmHandle> cached_pair(Fixture& f, std::size_t size) {
  auto a = f.buffer(size);
  f.free_buffer(a, size);
  return a;
}

bool has(const std::vector<VmOp>& ops, VmOp::Kind k, std::uint64_t what) {
  for (const VmOp& op : ops) {
    if (op.kind == k && (k == VmOp::Kind::kRelease ? op.handle == what : op.address == what)) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("the first buffer is adopted, the next ones are served without a driver call") {
  Fixture f;
  auto a = f.buffer(kMiB2);
  CHECK(f.real_reserves == 1);
  CHECK(f.real_creates == 1);
  CHECK(f.real_calls == 2);  // map, set access
  CHECK(f.cache.stats().adopted == 1);
  f.free_buffer(a, kMiB2);
  CHECK(f.real_calls == 2);  // unmap, release, free: recorded only
  CHECK(f.cache.stats().pending_pairs == 1);
  for (int i = 0; i < 10; ++i) {
    auto b = f.buffer(kMiB2);
    CHECK(b == a);  // the same pair
    f.free_buffer(b, kMiB2);
  }
  CHECK(f.real_reserves == 1);
  CHECK(f.real_creates == 1);
  CHECK(f.real_calls == 2);
  const VmmStats s = f.cache.stats();
  CHECK(s.create_hits == 10);
  CHECK(s.reserve_hits == 10);
  CHECK(s.ready_pairs + s.pending_pairs == 1);  // pending until a request polls its fence
  CHECK(s.ready_bytes + s.pending_bytes == kMiB2);
  // One fence per request that found only pairs given back since the last one.
  CHECK(f.fences == 10);
}

TEST_CASE("a pair is not lent again before the fence after its give-back completes") {
  Fixture f;
  f.device_idle = false;
  auto a = cached_pair(f, kMiB2);
  auto b = f.buffer(kMiB2);  // the device still runs work that may use a
  CHECK(b != a);
  CHECK(f.real_creates == 2);
  CHECK(f.fences == 1);
  f.free_buffer(b, kMiB2);
  f.finish_device_work();
  // The earlier fence covered a only; b's give-back needs one of its own.
  auto c = f.buffer(kMiB2);
  CHECK(c == a);
  auto d = f.buffer(kMiB2);
  CHECK(d != b);  // b's fence was recorded now, and the device is busy again
  CHECK(f.real_creates == 3);
  f.finish_device_work();
  f.free_buffer(c, kMiB2);
  f.free_buffer(d, kMiB2);
  f.device_idle = true;
  auto e = f.buffer(kMiB2);
  CHECK((e == c || e == d || e == b));
  CHECK(f.real_creates == 3);
}

TEST_CASE("create before reserve is served too") {
  Fixture f;
  const VmHandle h = f.create(4 * kMiB);
  const VmAddress va = f.reserve(4 * kMiB);
  REQUIRE(f.map(va, 4 * kMiB, h).empty());
  f.access(va, 4 * kMiB);
  f.free_buffer({va, h}, 4 * kMiB);
  const int calls = f.real_calls;
  for (int i = 0; i < 5; ++i) {
    const VmHandle h2 = f.create(4 * kMiB);
    const VmAddress va2 = f.reserve(4 * kMiB);
    CHECK(h2 == h);
    CHECK(va2 == va);
    REQUIRE(f.map(va2, 4 * kMiB, h2).empty());
    REQUIRE(f.access(va2, 4 * kMiB).empty());
    f.free_buffer({va2, h2}, 4 * kMiB);
  }
  CHECK(f.real_calls == calls);
  CHECK(f.real_creates == 1);
}

TEST_CASE("sizes are never mixed; a reserve's alignment must be met") {
  Fixture f;
  auto a = cached_pair(f, kMiB2);
  auto b = f.buffer(4 * kMiB);
  CHECK(b.first != a.first);
  CHECK(f.real_creates == 2);
  f.free_buffer(b, 4 * kMiB);
  // An alignment a's range does not meet.
  std::size_t align = 1;
  while (a.first % align == 0) align <<= 1;
  const VmAddress va = f.reserve(kMiB2, align);
  CHECK(va != a.first);
}

TEST_CASE("a different handle mapped into a lent range: the pair goes back to the driver first") {
  Fixture f;
  auto a = cached_pair(f, kMiB2);
  const VmAddress va = f.reserve(kMiB2);  // lent: still mapped to a's handle
  REQUIRE(va == a.first);
  const VmHandle other = f.next_handle++;
  f.cache.note_created(other, kMiB2);
  const std::vector<VmOp> ops = f.map(va, kMiB2, other);
  // The range is unmapped for real and the orphaned handle released; the range stays reserved.
  REQUIRE(ops.size() == 2);
  CHECK(ops[0].kind == VmOp::Kind::kUnmap);
  CHECK(ops[0].address == va);
  CHECK(has(ops, VmOp::Kind::kRelease, a.second));
  CHECK(!has(ops, VmOp::Kind::kAddressFree, va));
  CHECK(f.cache.stats().detached == 1);
  // The program's new mapping is whole and plain: a pair again.
  CHECK(f.cache.stats().adopted == 2);
  f.free_buffer({va, other}, kMiB2);
  CHECK(f.cache.stats().pending_pairs + f.cache.stats().ready_pairs == 1);
}

TEST_CASE("a partial map into a lent range settles the pair, and forms none") {
  Fixture f;
  auto a = cached_pair(f, 4 * kMiB);
  const VmAddress va = f.reserve(4 * kMiB);
  const VmHandle small = f.next_handle++;
  f.cache.note_created(small, kMiB2);
  const std::vector<VmOp> ops = f.map(va + kMiB2, kMiB2, small);
  CHECK(has(ops, VmOp::Kind::kUnmap, va));
  CHECK(has(ops, VmOp::Kind::kRelease, a.second));
  CHECK(f.cache.stats().adopted == 1);
  // Unmapping and freeing go to the driver as they are.
  CHECK(f.decided(f.cache.unmap(va + kMiB2, kMiB2)).empty());
  VmDecision d = f.cache.address_free(va, 4 * kMiB);
  CHECK(!d.served);
  CHECK(d.settle.empty());
}

TEST_CASE("a lent handle mapped elsewhere: the pair's range goes back to the driver") {
  Fixture f;
  auto a = cached_pair(f, kMiB2);
  const VmHandle h = f.create(kMiB2);  // lent: still mapped at a's range
  REQUIRE(h == a.second);
  const VmAddress elsewhere = 0x6000'0000'0000;  // a range the cache does not know
  const std::vector<VmOp> ops = f.map(elsewhere, kMiB2, h);
  REQUIRE(ops.size() == 2);
  CHECK(ops[0].kind == VmOp::Kind::kUnmap);
  CHECK(ops[1].kind == VmOp::Kind::kAddressFree);
  CHECK(ops[1].address == a.first);
  // The handle is the program's, known to be mapped outside a pair: its release is the driver's.
  VmDecision d = f.cache.release(h);
  CHECK(!d.served);
  CHECK(d.settle.empty());
}

TEST_CASE("release before unmap, and any order of give-back") {
  Fixture f;
  const VmAddress va = f.reserve(kMiB2);
  const VmHandle h = f.create(kMiB2);
  f.map(va, kMiB2, h);
  CHECK(f.decided(f.cache.release(h)).empty());  // released while mapped: still a pair
  f.access(va, kMiB2);
  CHECK(f.cache.stats().program_pairs == 1);
  CHECK(f.cache.unmap(va, kMiB2).served);
  CHECK(f.cache.address_free(va, kMiB2).served);
  CHECK(f.cache.stats().pending_pairs == 1);
  // Unmap, free the range, release last.
  auto b = f.buffer(kMiB2);
  CHECK(b.first == va);
  CHECK(f.cache.unmap(va, kMiB2).served);
  CHECK(f.cache.address_free(va, kMiB2).served);
  CHECK(f.cache.stats().pending_pairs == 0);
  CHECK(f.cache.release(h).served);
  CHECK(f.cache.stats().pending_pairs == 1);
}

TEST_CASE("a range kept across buffers gets its own handle back once the device is done") {
  Fixture f;
  f.device_idle = false;
  auto a = f.buffer(kMiB2);
  CHECK(f.cache.unmap(a.first, kMiB2).served);
  CHECK(f.cache.release(a.second).served);
  // The program keeps the range and makes a new handle for it: the device may still use a's.
  const VmHandle h = f.create(kMiB2);
  CHECK(h != a.second);
  const std::vector<VmOp> ops = f.map(a.first, kMiB2, h);
  CHECK(has(ops, VmOp::Kind::kUnmap, a.first));
  CHECK(has(ops, VmOp::Kind::kRelease, a.second));
  // Once the device is done, the same pattern finds its handle.
  CHECK(f.cache.unmap(a.first, kMiB2).served);
  CHECK(f.cache.release(h).served);
  f.finish_device_work();
  f.device_idle = true;
  CHECK(f.create(kMiB2) == h);
  CHECK(f.map(a.first, kMiB2, h).empty());
}

TEST_CASE("a set-access that differs from the pair's goes to the driver; the same one does not") {
  Fixture f;
  const auto a = cached_pair(f, kMiB2);
  auto b = f.buffer(kMiB2);
  REQUIRE(b == a);
  const int calls = f.real_calls;
  CHECK(f.access(b.first, kMiB2, 1).empty());  // read-only now
  CHECK(f.real_calls == calls + 1);
  CHECK(f.access(b.first, kMiB2, 1).empty());
  CHECK(f.real_calls == calls + 1);
  // A set-access on part of it: the pair settles (nothing to undo: the program holds it all).
  const VmAccess rw{0x1'0000'0000, 3};
  VmDecision d = f.cache.set_access(b.first, kMiB2 / 2, std::span<const VmAccess>(&rw, 1));
  CHECK(!d.served);
  CHECK(d.settle.empty());
  CHECK(f.cache.stats().detached == 1);
  CHECK(!f.cache.unmap(b.first, kMiB2).served);
}

TEST_CASE("calls that do not fit get the driver's answer on the program's own state") {
  Fixture f;
  auto a = f.buffer(kMiB2);
  SECTION("partial unmap") {
    VmDecision d = f.cache.unmap(a.first, kMiB2 / 2);
    CHECK(!d.served);
    CHECK(d.settle.empty());
  }
  SECTION("free of a mapped range") {
    VmDecision d = f.cache.address_free(a.first, kMiB2);
    CHECK(!d.served);
    CHECK(d.settle.empty());  // the driver refuses it, as it would have
  }
  SECTION("double release") {
    CHECK(f.cache.release(a.second).served);
    VmDecision d = f.cache.release(a.second);
    CHECK(!d.served);
    CHECK(has(d.settle, VmOp::Kind::kRelease, a.second));  // the first one, for real
  }
  SECTION("retained handle") {
    CHECK(f.cache.unmap(a.first, kMiB2).served);
    VmDecision d = f.cache.expose(a.first + 4096);
    CHECK(has(d.settle, VmOp::Kind::kUnmap, a.first));
    CHECK(!has(d.settle, VmOp::Kind::kRelease, a.second));
  }
  CHECK(f.cache.stats().detached == 1);
}

TEST_CASE("unknown ranges and handles are the driver's") {
  Fixture f;
  VmDecision d = f.cache.unmap(0x1234'0000'0000, kMiB2);
  CHECK(!d.served);
  CHECK(d.settle.empty());
  CHECK(!f.cache.release(77).served);
  CHECK(!f.cache.address_free(0x1234'0000'0000, kMiB2).served);
  // A handle mapped into a range the cache does not know never becomes a pair.
  const VmHandle h = f.create(kMiB2);
  f.map(0x1234'0000'0000, kMiB2, h);
  CHECK(f.cache.stats().adopted == 0);
  CHECK(!f.cache.release(h).served);
}

TEST_CASE("release_cached gives every cached pair back, pending ones too") {
  Fixture f;
  f.device_idle = false;
  auto a = f.buffer(kMiB2);
  auto b = f.buffer(4 * kMiB);
  auto c = f.buffer(kMiB2);
  f.free_buffer(a, kMiB2);
  f.free_buffer(b, 4 * kMiB);
  std::size_t bytes = 0;
  const std::vector<VmOp> ops = f.cache.release_cached(&bytes);
  CHECK(bytes == 6 * kMiB);
  CHECK(ops.size() == 6);
  CHECK(has(ops, VmOp::Kind::kUnmap, a.first));
  CHECK(has(ops, VmOp::Kind::kRelease, b.second));
  CHECK(has(ops, VmOp::Kind::kAddressFree, b.first));
  CHECK(!has(ops, VmOp::Kind::kUnmap, c.first));  // the program's
  const VmmStats s = f.cache.stats();
  CHECK(s.released == 2);
  CHECK(s.pending_pairs == 0);
  CHECK(s.program_pairs == 1);
  CHECK(f.cache.summary().find("virtual memory (cuMemCreate)") != std::string::npos);
}
