// Bad input from the program, with cudalloc preloaded over the fake driver: each call gets the
// driver's own answer (CUDA_ERROR_INVALID_VALUE for a pointer that is not the start of a live
// allocation, CUDA_ERROR_OUT_OF_MEMORY for a size no device has, ...), a warning goes to the
// log, and the cache is left intact: a live block keeps its contents and its range, the
// driver sees no stray free, and later allocations work. docs/reliability.md lists each case.
#include "common.h"

#include <cstdint>
#include <limits>
#include <random>

using namespace faults;

namespace {
constexpr std::size_t kMiB = 1 << 20;
constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();

void expect_cache_intact(Client& c, const Sentinel& keep) {
  CHECK(keep.intact());
  // Later allocations work and do not overlap the sentinel.
  CUdeviceptr p = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  CHECK((p + 4096 <= keep.p || p >= keep.p + keep.n));
  REQUIRE(c.api.cuMemsetD8_v2(p, 0x01, 4096) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK(keep.intact());
}
}  // namespace

TEST_CASE("free of a random address: CUDA_ERROR_INVALID_VALUE, cache intact", "[bad][random]") {
  Client& c = client::client();
  Sentinel keep(c, 64 * 1024, 0xa5);
  std::mt19937_64 rng(42);
  for (int i = 0; i < 2000; ++i) {
    CUdeviceptr p = rng();
    if (i % 4 == 0) p = keep.p + 512 + (rng() % (keep.n - 512));  // inside a live block
    if (i % 4 == 1) p = keep.p - 512 * (1 + rng() % 64);           // just before it (cached memory)
    if (p == 0 || p == keep.p) continue;
    INFO(std::hex << p);
    CHECK(c.api.cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
    CHECK(c.api.cuMemFreeAsync(p, nullptr) == CUDA_ERROR_INVALID_VALUE);
  }
  expect_cache_intact(c, keep);
}

TEST_CASE("double free (cuMemFree, cuMemFreeAsync, across the two): CUDA_ERROR_INVALID_VALUE", "[bad][double]") {
  Client& c = client::client();
  Sentinel keep(c, 4096, 0x3c);
  for (std::size_t n : {512ul, 100000ul, 3 * kMiB, 30 * kMiB}) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
    c.reset_stats();
    CHECK(c.api.cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
    CHECK(c.api.cuMemFreeAsync(p, nullptr) == CUDA_ERROR_INVALID_VALUE);
    CHECK(c.snapshot().mem_free == 0);  // never reached the driver
    CUdeviceptr q = 0;
    REQUIRE(c.api.cuMemAllocAsync(&q, n, nullptr) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemFreeAsync(q, nullptr) == CUDA_SUCCESS);
    CHECK(c.api.cuMemFreeAsync(q, nullptr) == CUDA_ERROR_INVALID_VALUE);
    CHECK(c.api.cuMemFree_v2(q) == CUDA_ERROR_INVALID_VALUE);
  }
  expect_cache_intact(c, keep);
}

TEST_CASE("interior pointer: CUDA_ERROR_INVALID_VALUE and the block stays live", "[bad][interior]") {
  Client& c = client::client();
  Sentinel keep(c, 4096, 0x3c);
  for (std::size_t n : {1024ul, 100000ul, 3 * kMiB}) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemsetD8_v2(p, 0x99, n) == CUDA_SUCCESS);
    for (std::size_t off : {1ul, 8ul, 512ul, n / 2, n - 1}) {
      CHECK(c.api.cuMemFree_v2(p + off) == CUDA_ERROR_INVALID_VALUE);
      CHECK(c.api.cuMemFreeAsync(p + off, nullptr) == CUDA_ERROR_INVALID_VALUE);
    }
    CHECK(all_equal(p, n, 0x99));
    CUdeviceptr base = 0;
    std::size_t size = 0;
    REQUIRE(c.api.cuMemGetAddressRange_v2(&base, &size, p + n / 2) == CUDA_SUCCESS);
    CHECK(base == p);
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
  expect_cache_intact(c, keep);
}

TEST_CASE("free from another thread: succeeds (as natively), exactly once", "[bad][thread]") {
  Client& c = client::client();
  Sentinel keep(c, 4096, 0x3c);
  std::vector<CUdeviceptr> ptrs(64);
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    REQUIRE(c.api.cuMemAlloc_v2(&ptrs[i], 512 + 1000 * i) == CUDA_SUCCESS);
  }
  std::vector<CUresult> first(ptrs.size()), second(ptrs.size());
  std::thread t([&] {
    REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
    for (std::size_t i = 0; i < ptrs.size(); ++i) first[i] = c.api.cuMemFree_v2(ptrs[i]);
  });
  t.join();
  // And a race: two threads free the same pointers; exactly one of each pair succeeds.
  for (std::size_t i = 0; i < ptrs.size(); ++i) REQUIRE(c.api.cuMemAlloc_v2(&ptrs[i], 512 + 1000 * i) == CUDA_SUCCESS);
  std::thread a([&] {
    REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
    for (std::size_t i = 0; i < ptrs.size(); ++i) first[i] = c.api.cuMemFree_v2(ptrs[i]);
  });
  std::thread b([&] {
    REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
    for (std::size_t i = 0; i < ptrs.size(); ++i) second[i] = c.api.cuMemFreeAsync(ptrs[i], nullptr);
  });
  a.join();
  b.join();
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    INFO(i);
    CHECK(((first[i] == CUDA_SUCCESS) != (second[i] == CUDA_SUCCESS)));
    CHECK((first[i] == CUDA_SUCCESS || first[i] == CUDA_ERROR_INVALID_VALUE));
    CHECK((second[i] == CUDA_SUCCESS || second[i] == CUDA_ERROR_INVALID_VALUE));
  }
  expect_cache_intact(c, keep);
}

TEST_CASE("free of a pointer of another device's context: succeeds (unified addressing), once", "[bad][device]") {
  Client& c = client::client();
  int count = 0;
  auto* get_count = c.api.cuDeviceGetCount;
  REQUIRE(get_count(&count) == CUDA_SUCCESS);
  if (count < 2) {
    WARN("one device only (FAKE_CUDA_DEVICES=2 runs this)");
    return;
  }
  Sentinel keep(c, 4096, 0x3c);
  CUdevice dev1 = 0;
  REQUIRE(c.api.cuDeviceGet(&dev1, 1) == CUDA_SUCCESS);
  CUcontext ctx1 = nullptr;
  REQUIRE(c.api.cuDevicePrimaryCtxRetain(&ctx1, dev1) == CUDA_SUCCESS);
  REQUIRE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  CUdeviceptr p1 = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p1, 1 * kMiB) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemsetD8_v2(p1, 0x21, kMiB) == CUDA_SUCCESS);
  REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);  // device 0 current
  CHECK(c.api.cuMemFree_v2(p1 + 512) == CUDA_ERROR_INVALID_VALUE);
  CHECK(c.api.cuMemFree_v2(p1) == CUDA_SUCCESS);
  CHECK(c.api.cuMemFree_v2(p1) == CUDA_ERROR_INVALID_VALUE);
  // Device 1's allocator got the block back: it serves it again there.
  REQUIRE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  CUdeviceptr q = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&q, 1 * kMiB) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
  REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  expect_cache_intact(c, keep);
}

TEST_CASE("free during capture: a parked free, bad frees still refused, the capture survives", "[bad][capture]") {
  Client& c = client::client();
  Sentinel keep(c, 4096, 0x3c);
  CUstream s = make_stream(c, CU_STREAM_NON_BLOCKING);
  CUdeviceptr mine = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&mine, 8192) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHECK(c.api.cuMemFree_v2(mine + 512) == CUDA_ERROR_INVALID_VALUE);  // interior
  CHECK(c.api.cuMemFree_v2(mine) == CUDA_SUCCESS);                    // parked
  CHECK(c.api.cuMemFree_v2(mine) == CUDA_ERROR_INVALID_VALUE);        // double
  CHECK(c.api.cuMemFreeAsync(mine, s) == CUDA_ERROR_INVALID_VALUE);   // double, async
  CHECK(keep.intact());
  CUgraph graph = nullptr;
  REQUIRE(c.api.cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);  // not invalidated by cudalloc
  CHECK(graph != nullptr);
  CHECK(c.api.cuMemFree_v2(mine) == CUDA_ERROR_INVALID_VALUE);  // the parked free ran
  if (auto* destroy = c.get<CUresult (*)(CUgraph)>("cuGraphDestroy")) destroy(graph);
  REQUIRE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
  expect_cache_intact(c, keep);
}

TEST_CASE("huge sizes: CUDA_ERROR_OUT_OF_MEMORY (0 bytes: CUDA_ERROR_INVALID_VALUE); nothing reserved", "[bad][huge]") {
  Client& c = client::client();
  Sentinel keep(c, 4096, 0x3c);
  const auto before = c.snapshot();
  for (std::size_t n : {kMax, kMax - 511, kMax / 2 + 1, std::size_t{1} << 62, std::size_t{1} << 40,
                        std::size_t{3} << 30}) {  // FAKE_CUDA_MEMORY_MB=2048: 3 GiB does not fit
    INFO(n);
    CUdeviceptr p = 0xbad;
    CHECK(c.api.cuMemAlloc_v2(&p, n) == CUDA_ERROR_OUT_OF_MEMORY);
    CUdeviceptr q = 0xbad;
    CHECK(c.api.cuMemAllocAsync(&q, n, nullptr) == CUDA_ERROR_OUT_OF_MEMORY);
  }
  CUdeviceptr p = 0;
  CHECK(c.api.cuMemAlloc_v2(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(c.api.cuMemAlloc_v2(nullptr, 4096) == CUDA_ERROR_INVALID_VALUE);
  CHECK(c.snapshot().bytes_in_use <= before.bytes_in_use);
  expect_cache_intact(c, keep);
}

TEST_CASE("cuMemAllocPitch with negative or overflowing pitch/height: CUDA_ERROR_INVALID_VALUE", "[bad][pitch]") {
  Client& c = client::client();
  Sentinel keep(c, 4096, 0x3c);
  auto* pitch_alloc = c.get<CUresult (*)(CUdeviceptr*, size_t*, size_t, size_t, unsigned)>("cuMemAllocPitch");
  REQUIRE(pitch_alloc != nullptr);
  CUdeviceptr p = 0;
  size_t pitch = 12345;
  const auto neg = static_cast<size_t>(-1);  // a negative int passed as size_t
  const size_t bad[][2] = {{neg, 1}, {1, neg}, {neg - 511, 1}, {size_t{1} << 40, size_t{1} << 40},
                           {kMax / 2, 4}, {kMax - 3, 1}, {static_cast<size_t>(-512), 2}, {0, 10}, {10, 0}};
  for (const auto& wh : bad) {
    INFO(wh[0] << " x " << wh[1]);
    const CUresult r = pitch_alloc(&p, &pitch, wh[0], wh[1], 4);
    CHECK((r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_OUT_OF_MEMORY));
    if (wh[0] == 0 || wh[1] == 0 || wh[0] > kMax - 511) CHECK(r == CUDA_ERROR_INVALID_VALUE);
  }
  CHECK(pitch_alloc(&p, &pitch, 1000, 10, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(pitch_alloc(&p, &pitch, 1000, 10, 32) == CUDA_ERROR_INVALID_VALUE);
  CHECK(pitch_alloc(nullptr, &pitch, 1000, 10, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(pitch_alloc(&p, nullptr, 1000, 10, 4) == CUDA_ERROR_INVALID_VALUE);
  // A good one still works.
  REQUIRE(pitch_alloc(&p, &pitch, 1000, 10, 8) == CUDA_SUCCESS);
  CHECK(pitch == 1024);
  REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  expect_cache_intact(c, keep);
}
