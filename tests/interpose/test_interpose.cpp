// cudalloc preloaded into a program that reaches the (fake) driver the way cudart does.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "client.h"

using client::Client;
using client::is_cudalloc;

namespace {

using PFN_alloc = CUresult (*)(CUdeviceptr*, size_t);
using PFN_free = CUresult (*)(CUdeviceptr);

std::vector<unsigned char> read_back(Client& c, CUdeviceptr p, size_t n) {
  std::vector<unsigned char> host(n);
  REQUIRE(c.api.cuMemcpyDtoH_v2(host.data(), p, n) == CUDA_SUCCESS);
  return host;
}

bool all_equal(const std::vector<unsigned char>& v, unsigned char x) {
  for (unsigned char b : v) {
    if (b != x) return false;
  }
  return true;
}

CUstream make_stream(Client& c, unsigned flags) {
  CUstream s = nullptr;
  REQUIRE(c.api.cuStreamCreate(&s, flags) == CUDA_SUCCESS);
  return s;
}

}  // namespace

TEST_CASE("the runtime's lookups get cudalloc's wrappers", "[lookup]") {
  Client& c = client::client();
  for (const auto& l : c.rt.lookups) {
    INFO(l.name << " v" << l.version << " flags " << l.flags);
    CHECK(l.result == l.expected);
  }
  CHECK(is_cudalloc(c.rt.dlsym_cuGetProcAddress_v2));
  for (const char* name : {"cuGetProcAddress", "cuMemAlloc", "cuMemFree", "cuMemAllocAsync", "cuMemFreeAsync",
                           "cuMemAllocPitch", "cuMemGetInfo", "cuMemGetAddressRange", "cuPointerGetAttribute",
                           "cuPointerGetAttributes", "cuIpcGetMemHandle", "cuStreamCreate", "cuStreamDestroy",
                           "cuStreamBeginCapture", "cuStreamEndCapture", "cuDevicePrimaryCtxReset",
                           "cuDevicePrimaryCtxRelease"}) {
    INFO(name);
    const fakecuda::Lookup* l = c.rt.find(name, 0);
    REQUIRE(l != nullptr);
    CHECK(is_cudalloc(l->pfn));
  }
  // Per-thread-default-stream lookups get the _ptsz hooks.
  CHECK(is_cudalloc(c.rt.find("cuMemAllocAsync", 2)->pfn));
  CHECK(is_cudalloc(c.rt.find("cuMemFreeAsync", 2)->pfn));
  CHECK(reinterpret_cast<void*>(c.api.cuMemAllocAsync_ptsz) != reinterpret_cast<void*>(c.api.cuMemAllocAsync));
  // The calls that queue work, legacy and per-thread, are wrapped (the submission watch).
  CHECK(is_cudalloc(reinterpret_cast<void*>(c.api.cuMemcpyHtoD_v2)));
  for (const char* name : {"cuLaunchKernel", "cuLaunchKernelEx", "cuMemcpyAsync", "cuMemsetD8Async", "cuGraphLaunch",
                           "cuLaunchHostFunc"}) {
    for (unsigned flags : {0u, 2u}) {
      INFO(name << " flags " << flags);
      const fakecuda::Lookup* l = c.rt.find(name, flags);
      REQUIRE(l != nullptr);
      CHECK(is_cudalloc(l->pfn));
    }
  }
  // What is not wrapped is the driver's own.
  CHECK_FALSE(is_cudalloc(reinterpret_cast<void*>(c.api.cuStreamIsCapturing)));
  CHECK_FALSE(is_cudalloc(c.get<void*>("cuGraphAddMemcpyNode")));
  CHECK_FALSE(is_cudalloc(c.get<void*>("cuMemAllocManaged")));
  CHECK_FALSE(is_cudalloc(c.get<void*>("cuMemAllocFromPoolAsync")));
}

TEST_CASE("direct dlsym and cudaGetDriverEntryPoint paths are covered", "[lookup]") {
  Client& c = client::client();
  // PyTorch, cuBLAS and JAX call dlsym(libcuda, "cuMemAlloc_v2") themselves.
  CHECK(is_cudalloc(dlsym(c.rt.handle, "cuMemAlloc_v2")));
  CHECK(is_cudalloc(dlsym(c.rt.handle, "cuMemFree_v2")));
  CHECK(is_cudalloc(dlsym(c.rt.handle, "cuMemAllocAsync_ptsz")));
  CHECK(is_cudalloc(dlsym(c.rt.handle, "cuMemcpy")));
  CHECK(is_cudalloc(dlsym(c.rt.handle, "cuLaunchKernel_ptsz")));
  CHECK_FALSE(is_cudalloc(dlsym(c.rt.handle, "cuEventQuery")));
  CHECK(dlsym(c.rt.handle, "no_such_symbol_anywhere") == nullptr);
  // cudaGetDriverEntryPoint goes through the cuGetProcAddress the runtime holds.
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status{};
  REQUIRE(c.api.cuGetProcAddress_v2("cuMemAlloc", &pfn, 12000, 0, &status) == CUDA_SUCCESS);
  CHECK(is_cudalloc(pfn));
  REQUIRE(c.api.cuGetProcAddress_v2("cuGetProcAddress", &pfn, 12000, 0, &status) == CUDA_SUCCESS);
  CHECK(is_cudalloc(pfn));
  REQUIRE(c.api.cuGetProcAddress_v2("cuMemFreeAsync", &pfn, 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                    &status) == CUDA_SUCCESS);
  CHECK(pfn == dlsym(c.rt.handle, "cuMemFreeAsync_ptsz"));
}

TEST_CASE("cached allocations do not reach the driver", "[cache]") {
  Client& c = client::client();
  c.reset_stats();
  for (int i = 0; i < 200; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, 1000 + i) == CUDA_SUCCESS);
    REQUIRE(p != 0);
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
  const auto s = c.snapshot();
  CHECK(s.mem_alloc <= 4);  // a few segments while the first fences complete
  CHECK(s.mem_free == 0);
}

TEST_CASE("native answers are kept", "[semantics]") {
  Client& c = client::client();
  CUdeviceptr p = 0;
  CHECK(c.api.cuMemAlloc_v2(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(c.api.cuMemFree_v2(0) == CUDA_SUCCESS);

  REQUIRE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  CHECK(c.api.cuMemFree_v2(p + 512) == CUDA_ERROR_INVALID_VALUE);  // interior
  // The cache is intact: the block is still live and can be described and freed.
  CUdeviceptr base = 0;
  size_t size = 0;
  REQUIRE(c.api.cuMemGetAddressRange_v2(&base, &size, p + 100) == CUDA_SUCCESS);
  CHECK(base == p);
  CHECK(size >= 4096);
  CHECK(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK(c.api.cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);  // double
  c.reset_stats();
  CHECK(c.api.cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
  CHECK(c.snapshot().mem_free == 0);  // never reached the driver

  // A pointer cudalloc does not own goes to the driver.
  auto* managed = c.get<CUresult (*)(CUdeviceptr*, size_t, unsigned)>("cuMemAllocManaged");
  REQUIRE(managed != nullptr);
  CUdeviceptr m = 0;
  REQUIRE(managed(&m, 4096, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  c.reset_stats();
  CHECK(c.api.cuMemFree_v2(m) == CUDA_SUCCESS);
  CHECK(c.snapshot().mem_free == 1);
}

TEST_CASE("every block is 512-byte aligned; address range and attributes describe the block", "[semantics]") {
  Client& c = client::client();
  std::vector<CUdeviceptr> ptrs;
  for (size_t n : {1ul, 7ul, 511ul, 513ul, 1000ul, 4097ul, 65537ul, 1048575ul, 3000000ul}) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    CHECK(p % 512 == 0);
    CUdeviceptr base = 0;
    size_t size = 0;
    REQUIRE(c.api.cuMemGetAddressRange_v2(&base, &size, p + n - 1) == CUDA_SUCCESS);
    CHECK(base == p);
    CHECK(size >= n);
    CHECK(size < n + 2 * 1024 * 1024);
    CUdeviceptr start = 0;
    REQUIRE(c.api.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + n / 2) == CUDA_SUCCESS);
    CHECK(start == p);
    size_t range = 0;
    REQUIRE(c.api.cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) == CUDA_SUCCESS);
    CHECK(range == size);
    auto* attrs = c.get<CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr)>("cuPointerGetAttributes");
    CUpointer_attribute which[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    CUdeviceptr s2 = 0;
    size_t r2 = 0;
    void* out[2] = {&s2, &r2};
    REQUIRE(attrs(2, which, out, p + 1) == CUDA_SUCCESS);
    CHECK(s2 == p);
    CHECK(r2 == size);
    ptrs.push_back(p);
  }
  for (CUdeviceptr p : ptrs) REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
}

TEST_CASE("a freed block's memory is not a valid pointer, though its segment stays cached", "[semantics]") {
  Client& c = client::client();
  CUdeviceptr a = 0, b = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&a, 4096) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemAlloc_v2(&b, 4096) == CUDA_SUCCESS);  // keeps the segment in use
  unsigned type = 0;
  REQUIRE(c.api.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a) == CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
  REQUIRE(c.api.cuMemFree_v2(a) == CUDA_SUCCESS);
  type = 12345;
  CHECK(c.api.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a) == CUDA_ERROR_INVALID_VALUE);
  CUcontext ctx = nullptr;
  CHECK(c.api.cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, a + 100) == CUDA_ERROR_INVALID_VALUE);
  // The plural call answers as for memory that is not CUDA's: success, with the defaults.
  auto* attrs = c.get<CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr)>("cuPointerGetAttributes");
  REQUIRE(attrs != nullptr);
  CUpointer_attribute which[3] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  ctx = reinterpret_cast<CUcontext>(1);
  unsigned type2 = 7;
  size_t size = 7;
  void* out[3] = {&ctx, &type2, &size};
  CHECK(attrs(3, which, out, a) == CUDA_SUCCESS);
  CHECK(ctx == nullptr);
  CHECK(type2 == 0);
  CHECK(size == 0);
  // The live neighbour is still described as before.
  REQUIRE(c.api.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, b) == CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
  REQUIRE(c.api.cuMemFree_v2(b) == CUDA_SUCCESS);
}

namespace {

// CU_POINTER_ATTRIBUTE_BUFFER_ID through cuPointerGetAttribute; 0 where it fails.
unsigned long long buffer_id(Client& c, CUdeviceptr p) {
  unsigned long long id = 0;
  return c.api.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) == CUDA_SUCCESS ? id : 0;
}

// The same through cuPointerGetAttributes, beside the range start; 0 where it fails.
unsigned long long buffer_id_plural(Client& c, CUdeviceptr p) {
  auto* attrs = c.get<CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr)>("cuPointerGetAttributes");
  REQUIRE(attrs != nullptr);
  CUpointer_attribute which[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_BUFFER_ID};
  CUdeviceptr start = 0;
  unsigned long long id = 12345;
  void* out[2] = {&start, &id};
  return attrs(2, which, out, p) == CUDA_SUCCESS ? id : 0;
}

// What the driver itself answers for `p` (for a cached block: its segment's), past cudalloc.
template <typename T>
T native_attribute(Client& c, CUpointer_attribute attr, CUdeviceptr p) {
  auto* native = reinterpret_cast<fakecuda_native_pointer_attribute_fn>(
      dlsym(c.rt.handle, "fakecuda_native_pointer_attribute"));
  REQUIRE(native != nullptr);
  T value{};
  REQUIRE(native(&value, attr, p) == CUDA_SUCCESS);
  return value;
}

constexpr unsigned long long kCudallocIdBit = 1ull << 63;

}  // namespace

// Natively every allocation has a buffer id of its own, never reused in the process; registration
// caches (UCX, MPI, NCCL) key on it to see that an address now belongs to another allocation.
TEST_CASE("each hand-out of a cached block has a buffer id of its own", "[semantics]") {
  Client& c = client::client();
  // Blocks of one segment (the driver's allocation around them is the same).
  std::vector<CUdeviceptr> live;
  for (int i = 0; i < 8; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    live.push_back(p);
  }
  bool shared_segment = false;
  std::set<unsigned long long> ids;
  for (CUdeviceptr p : live) {
    const unsigned long long id = buffer_id(c, p);
    INFO("block 0x" << std::hex << p << " id 0x" << id);
    CHECK((id & kCudallocIdBit) != 0);  // never one of the driver's, which count from 1
    CHECK(id != native_attribute<unsigned long long>(c, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
    // The same at every query while the block lives, interior pointers and the plural call included.
    CHECK(buffer_id(c, p + 100) == id);
    CHECK(buffer_id_plural(c, p + 4095) == id);
    CHECK(buffer_id(c, p) == id);
    ids.insert(id);
    for (CUdeviceptr q : live) {
      shared_segment |= q != p && native_attribute<CUdeviceptr>(c, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q) ==
                                      native_attribute<CUdeviceptr>(c, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    }
  }
  CHECK(shared_segment);
  CHECK(ids.size() == live.size());

  // Freed: as natively for freed memory (cudalloc's answer for a freed block is unchanged).
  const CUdeviceptr gone = live.back();
  live.pop_back();
  REQUIRE(c.api.cuMemFree_v2(gone) == CUDA_SUCCESS);
  unsigned long long id = 7;
  CHECK(c.api.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, gone) == CUDA_ERROR_INVALID_VALUE);
  CHECK(buffer_id_plural(c, gone) == 0);  // the driver's answer for memory that is not CUDA's
  for (CUdeviceptr p : live) REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);

  // A block freed and handed out again at the same address is a new allocation, from the
  // thread's cache (stream order: the same block at once) and from the locked path (past the
  // thread caches' bound).
  CUstream s = make_stream(c, CU_STREAM_NON_BLOCKING);
  for (size_t n : {size_t{4096}, size_t{3} << 20, size_t{300} << 20}) {
    INFO("size " << n);
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAllocAsync(&p, n, s) == CUDA_SUCCESS);
    std::set<unsigned long long> seen{buffer_id(c, p)};
    for (int round = 0; round < 3; ++round) {
      REQUIRE(c.api.cuMemFreeAsync(p, s) == CUDA_SUCCESS);
      CUdeviceptr again = 0;
      REQUIRE(c.api.cuMemAllocAsync(&again, n, s) == CUDA_SUCCESS);
      REQUIRE(again == p);
      const unsigned long long fresh = buffer_id(c, p);
      CHECK((fresh & kCudallocIdBit) != 0);
      CHECK(seen.insert(fresh).second);
      CHECK(buffer_id_plural(c, p) == fresh);
    }
    REQUIRE(c.api.cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  }
  REQUIRE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

TEST_CASE("buffer ids of blocks handed out on several threads never collide", "[semantics]") {
  Client& c = client::client();
  constexpr int kThreads = 6;
  constexpr int kRounds = 300;
  std::vector<std::vector<unsigned long long>> ids(kThreads);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (c.api.cuCtxSetCurrent(c.ctx) != CUDA_SUCCESS) {
        ++failures[t];
        return;
      }
      for (int r = 0; r < kRounds; ++r) {
        // Two live blocks at a time, by cudaMalloc and in stream order: cached hand-outs of
        // blocks of shared segments, and the locked path's at the start.
        CUdeviceptr a = 0, b = 0;
        const size_t n = 512 * (1 + (r + t) % 4);
        if (c.api.cuMemAlloc_v2(&a, n) != CUDA_SUCCESS || c.api.cuMemAllocAsync_ptsz(&b, n, nullptr) != CUDA_SUCCESS) {
          ++failures[t];
          return;
        }
        const unsigned long long ia = buffer_id(c, a), ib = buffer_id(c, b);
        if (ia == 0 || ib == 0 || buffer_id(c, a) != ia) ++failures[t];
        ids[t].push_back(ia);
        ids[t].push_back(ib);
        if (c.api.cuMemFree_v2(a) != CUDA_SUCCESS || c.api.cuMemFreeAsync_ptsz(b, nullptr) != CUDA_SUCCESS) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<unsigned long long> all;
  size_t total = 0;
  for (int t = 0; t < kThreads; ++t) {
    CHECK(failures[t] == 0);
    total += ids[t].size();
    all.insert(ids[t].begin(), ids[t].end());
  }
  CHECK(total == size_t{2} * kThreads * kRounds);
  CHECK(all.size() == total);
}

TEST_CASE("cuMemAllocPitch validates and rounds like the driver", "[semantics]") {
  Client& c = client::client();
  auto* pitch_alloc = c.get<CUresult (*)(CUdeviceptr*, size_t*, size_t, size_t, unsigned)>("cuMemAllocPitch");
  REQUIRE(pitch_alloc != nullptr);
  CUdeviceptr p = 0;
  size_t pitch = 0;
  REQUIRE(pitch_alloc(&p, &pitch, 1000, 10, 4) == CUDA_SUCCESS);
  CHECK(pitch == 1024);
  CHECK(p % 512 == 0);
  CHECK(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK(pitch_alloc(&p, &pitch, 1000, 10, 3) == CUDA_ERROR_INVALID_VALUE);
  CHECK(pitch_alloc(&p, &pitch, 0, 10, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(pitch_alloc(&p, &pitch, size_t{1} << 40, size_t{1} << 40, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(pitch_alloc(&p, &pitch, ~size_t{0} - 3, 1, 4) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("cuMemGetInfo counts idle cached bytes as free", "[semantics]") {
  Client& c = client::client();
  CUdeviceptr p = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p, 64 << 20) == CUDA_SUCCESS);
  size_t free_live = 0, total = 0;
  REQUIRE(c.api.cuMemGetInfo_v2(&free_live, &total) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  size_t free_after = 0, total_after = 0;
  REQUIRE(c.api.cuMemGetInfo_v2(&free_after, &total_after) == CUDA_SUCCESS);
  CHECK(total_after == total);
  CHECK(free_after >= free_live + (64 << 20));
  CHECK(free_after <= total);
  // The driver's own free memory plus at least the 64 MiB block cudalloc keeps cached.
  const auto s = c.snapshot();
  CHECK(free_after >= total - s.bytes_in_use + (64 << 20));
}

TEST_CASE("cudaMemPoolTrimTo on the default pool gives cudalloc's idle memory back", "[trim]") {
  Client& c = client::client();
  CUmemoryPool pool = nullptr;
  auto trim = default_pool_trim(c, &pool);
  REQUIRE(trim != nullptr);
  CHECK(is_cudalloc(reinterpret_cast<void*>(trim)));

  // Whatever earlier cases left idle goes first, so that the blocks below get segments of their own.
  REQUIRE(trim(pool, 0) == CUDA_SUCCESS);
  constexpr size_t kLive = 80 << 20, kIdle = 96 << 20;
  c.reset_stats();
  CUdeviceptr live = 0, idle = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&live, kLive) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemsetD8_v2(live, 0x5a, kLive) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemAlloc_v2(&idle, kIdle) == CUDA_SUCCESS);
  REQUIRE(c.snapshot().mem_alloc == 2);
  REQUIRE(c.api.cuMemFree_v2(idle) == CUDA_SUCCESS);

  // More than cudalloc holds is kept: nothing goes back.
  REQUIRE(trim(pool, size_t{1} << 40) == CUDA_SUCCESS);
  CHECK(c.snapshot().mem_free == 0);
  // Keep 0: the idle block's segment goes back to the driver, the live one stays with its bytes.
  REQUIRE(trim(pool, 0) == CUDA_SUCCESS);
  CHECK(c.snapshot().mem_free == 1);
  CHECK(all_equal(read_back(c, live, kLive), 0x5a));
  REQUIRE(c.api.cuMemFree_v2(live) == CUDA_SUCCESS);
  // A pool that is not the device's: the driver's answer, nothing of cudalloc's trimmed.
  CHECK(trim(nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
}

// Frees `p` (a block the late write on some stream still targets), then runs pairs of its size
// until the block comes back (a fence that forgot the stream) or 4000 pairs: enough that its
// batch is fenced and the fence queried. A new owner sets its bytes to 0x55 and keeps it.
// Returns whether it came back.
static bool free_then_chase(Client& c, CUdeviceptr p, size_t n) {
  REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  for (int i = 0; i < 4000; ++i) {
    CUdeviceptr x = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&x, n) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemsetD8_v2(x, 0x55, n) == CUDA_SUCCESS);
    if (x == p) return true;
    REQUIRE(c.api.cuMemFree_v2(x) == CUDA_SUCCESS);
  }
  return false;
}

// After the late write has run: a block that came back to its new owner still holds the
// owner's bytes; it is freed.
static void check_chased(Client& c, CUdeviceptr p, size_t n, bool reused) {
  INFO("the block came back to a new owner: " << reused);
  if (reused) {
    CHECK(all_equal(read_back(c, p, n), 0x55));
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
}

TEST_CASE("a late write on a non-blocking stream never corrupts the next owner", "[race]") {
  Client& c = client::client();
  CUstream nb = make_stream(c, CU_STREAM_NON_BLOCKING);
  const size_t n = 1 << 20;
  for (int round = 0; round < 5; ++round) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    // Queued now, runs 30 ms later, writes 0xAA over the whole block.
    REQUIRE(c.launch_write(nb, p, n, 0xAA, 30000) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);  // returns at once
    std::vector<CUdeviceptr> got;
    for (int i = 0; i < 4; ++i) {
      CUdeviceptr q = 0;
      REQUIRE(c.api.cuMemAlloc_v2(&q, n) == CUDA_SUCCESS);
      REQUIRE(c.api.cuMemsetD8_v2(q, 0x55, n) == CUDA_SUCCESS);
      got.push_back(q);
    }
    REQUIRE(c.api.cuStreamSynchronize(nb) == CUDA_SUCCESS);
    for (CUdeviceptr q : got) {
      CHECK(all_equal(read_back(c, q, n), 0x55));
      REQUIRE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
    }
  }
  REQUIRE(c.api.cuStreamDestroy_v2(nb) == CUDA_SUCCESS);
}

TEST_CASE("a block freed under a late write on a non-blocking stream comes back only after it", "[race]") {
  // The frees after it fill its batch, whose fence is then queried: a fence blind to the
  // stream would pass at once and hand the block out under the write.
  Client& c = client::client();
  CUstream nb = make_stream(c, CU_STREAM_NON_BLOCKING);
  const size_t n = 64 << 10;
  CUdeviceptr p = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
  REQUIRE(c.launch_write(nb, p, n, 0xAA, 500000) == CUDA_SUCCESS);
  const bool reused = free_then_chase(c, p, n);
  REQUIRE(c.api.cuStreamSynchronize(nb) == CUDA_SUCCESS);
  check_chased(c, p, n, reused);
  REQUIRE(c.api.cuStreamDestroy_v2(nb) == CUDA_SUCCESS);
}

namespace {

// `count` cudaMalloc'd pairs of 64 KiB, each block written by a kernel on the legacy stream
// before its free: a device fence every batch.
void fenced_pairs(Client& c, int count) {
  for (int i = 0; i < count; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, 64 << 10) == CUDA_SUCCESS);
    REQUIRE(c.launch_write(nullptr, p, 1, 0, 0) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
}

}  // namespace

TEST_CASE("a device fence is one event recorded for the whole context", "[race][own-process]") {
  Client& c = client::client();
  CUstream a = make_stream(c, CU_STREAM_NON_BLOCKING);
  CUstream b = make_stream(c, CU_STREAM_NON_BLOCKING);
  for (const bool busy : {false, true}) {
    if (busy) REQUIRE(c.launch_sleep(a, 1000000) == CUDA_SUCCESS);
    c.reset_stats();
    fenced_pairs(c, 2048);
    INFO("stream a busy: " << busy);
    CHECK(c.call_count("cuCtxRecordEvent") > 0);
    CHECK(c.call_count("cuEventRecord") == 0);
    CHECK(c.call_count("cuStreamQuery") == 0);
  }
  REQUIRE(c.api.cuStreamSynchronize(a) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(a) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(b) == CUDA_SUCCESS);
}

// Run with FAKE_CUDA_NO_CTX_EVENTS=1 (meson: interpose_fence_per_stream): a driver without
// cuCtxRecordEvent.
TEST_CASE("a device fence asks idle non-blocking streams instead of recording events on them", "[race][own-process][per-stream-fence]") {
  Client& c = client::client();
  CUstream a = make_stream(c, CU_STREAM_NON_BLOCKING);
  CUstream b = make_stream(c, CU_STREAM_NON_BLOCKING);
  // Refused once, the context's event is not asked for again.
  fenced_pairs(c, 2048);
  // Both idle: each fence records the legacy stream's event and queries a and b.
  c.reset_stats();
  fenced_pairs(c, 2048);
  CHECK(c.call_count("cuCtxRecordEvent") == 0);
  const std::uint64_t fences = c.call_count("cuEventRecord");
  REQUIRE(fences > 0);
  CHECK(c.call_count("cuStreamQuery") == 2 * fences);
  // `a` busy for the whole loop: each fence records an event on it too. It is queried at the
  // first fence and then once per 9 (the 8 after a busy answer record without asking).
  REQUIRE(c.launch_sleep(a, 1000000) == CUDA_SUCCESS);
  c.reset_stats();
  fenced_pairs(c, 1024);
  const std::uint64_t records = c.call_count("cuEventRecord");
  REQUIRE(records > 0);
  CHECK(records % 2 == 0);
  const std::uint64_t busy_fences = records / 2;
  CHECK(c.call_count("cuStreamQuery") == busy_fences + (busy_fences + 8) / 9);
  REQUIRE(c.api.cuStreamSynchronize(a) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(a) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(b) == CUDA_SUCCESS);
}

TEST_CASE("a context event the driver refuses gives way to per-stream fences", "[race][own-process][ctx-event-refused]") {
  Client& c = client::client();
  REQUIRE(c.fail_next != nullptr);
  CUstream a = make_stream(c, CU_STREAM_NON_BLOCKING);
  c.fail_next("cuCtxRecordEvent", 0, CUDA_ERROR_NOT_SUPPORTED);
  c.reset_stats();
  fenced_pairs(c, 2048);
  CHECK(c.call_count("cuCtxRecordEvent") == 1);
  CHECK(c.call_count("cuEventRecord") > 0);
  // The fences that follow still wait for a non-blocking stream's late write.
  const size_t n = 64 << 10;
  CUdeviceptr p = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
  REQUIRE(c.launch_write(a, p, n, 0xAA, 500000) == CUDA_SUCCESS);
  const bool reused = free_then_chase(c, p, n);
  REQUIRE(c.api.cuStreamSynchronize(a) == CUDA_SUCCESS);
  check_chased(c, p, n, reused);
  CHECK(c.call_count("cuCtxRecordEvent") == 1);
  REQUIRE(c.api.cuStreamDestroy_v2(a) == CUDA_SUCCESS);
}

TEST_CASE("a late write on a green context's stream never corrupts the next owner", "[race]") {
  Client& c = client::client();
  // Programs reach it by name (the runtime does not look it up): our hook, through dlsym.
  using PFN_green_stream = CUresult (*)(CUstream*, CUgreenCtx, unsigned, int);
  auto create = reinterpret_cast<PFN_green_stream>(dlsym(c.rt.handle, "cuGreenCtxStreamCreate"));
  REQUIRE(is_cudalloc(reinterpret_cast<void*>(create)));
  CUstream gs = nullptr;
  REQUIRE(create(&gs, nullptr, CU_STREAM_NON_BLOCKING, 0) == CUDA_SUCCESS);
  const size_t n = 64 << 10;
  CUdeviceptr p = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
  REQUIRE(c.launch_write(gs, p, n, 0xAA, 500000) == CUDA_SUCCESS);
  // A fence blind to the green stream passes at once and hands the block out under the write.
  const bool reused = free_then_chase(c, p, n);
  REQUIRE(c.api.cuStreamSynchronize(gs) == CUDA_SUCCESS);
  check_chased(c, p, n, reused);
  REQUIRE(c.api.cuStreamDestroy_v2(gs) == CUDA_SUCCESS);
}

TEST_CASE("a late write on a destroyed non-blocking stream never corrupts the next owner", "[race]") {
  // cuStreamDestroy returns at once and the stream's queued work still runs: device fences
  // recorded after it must still wait for that work.
  Client& c = client::client();
  const size_t n = 64 << 10;
  CUstream nb = make_stream(c, CU_STREAM_NON_BLOCKING);
  CUdeviceptr p = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
  REQUIRE(c.launch_write(nb, p, n, 0xAA, 500000) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(nb) == CUDA_SUCCESS);
  const bool reused = free_then_chase(c, p, n);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the late write has run
  check_chased(c, p, n, reused);
}

TEST_CASE("a late write on the per-thread default stream never corrupts the next owner", "[race]") {
  Client& c = client::client();
  const size_t n = 1 << 20;
  CUdeviceptr p = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
  REQUIRE(c.launch_write(CU_STREAM_PER_THREAD, p, n, 0xAA, 30000) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  std::vector<CUdeviceptr> got;
  std::thread other([&] {
    REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
    for (int i = 0; i < 4; ++i) {
      CUdeviceptr q = 0;
      REQUIRE(c.api.cuMemAlloc_v2(&q, n) == CUDA_SUCCESS);
      REQUIRE(c.api.cuMemsetD8_v2_ptds(q, 0x55, n) == CUDA_SUCCESS);  // its own per-thread stream
      got.push_back(q);
    }
  });
  other.join();
  REQUIRE(c.api.cuStreamSynchronize_ptsz(nullptr) == CUDA_SUCCESS);
  for (CUdeviceptr q : got) {
    CHECK(all_equal(read_back(c, q, n), 0x55));
    REQUIRE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
  }
}

// With no non-blocking stream in the context, the device fence that closes a cudaFree epoch is
// one event on the legacy stream, and it orders reuse: the freed blocks go back to the program
// while their last owner's work is still queued, because every stream's later work waits for
// that event (blocking streams and per-thread default streams wait for earlier legacy work).
TEST_CASE("with blocking streams only, cudaFree'd blocks come back at once and their last owner's work still runs first",
          "[race]") {
  Client& c = client::client();
  const size_t n = 16 << 20;
  // Non-blocking streams destroyed earlier (here or by other tests) have run their last work:
  // until then device fences wait for it, and cannot order reuse.
  REQUIRE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  CUstream old_owner = make_stream(c, 0);
  // Four blocks fill a 64 MiB epoch; each gets a write that runs 50 ms after the one before.
  // They are taken on another thread: this thread's frees of them then go to the allocator's
  // epoch (a thread that frees large blocks it took itself keeps them in its own batches).
  std::set<CUdeviceptr> freed;
  std::thread taker([&] {
    REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
    for (int i = 0; i < 4; ++i) {
      CUdeviceptr p = 0;
      REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
      freed.insert(p);
    }
  });
  taker.join();
  for (CUdeviceptr p : freed) REQUIRE(c.launch_write(old_owner, p, n, 0xAA, 50000) == CUDA_SUCCESS);
  for (CUdeviceptr p : freed) REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  CUevent late_done = nullptr;
  REQUIRE(c.api.cuEventCreate(&late_done, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  REQUIRE(c.api.cuEventRecord(late_done, old_owner) == CUDA_SUCCESS);
  // The new owners write 0x55 from another blocking stream, or from another thread's
  // per-thread default stream.
  const bool per_thread = GENERATE(false, true);
  INFO("new owners on " << (per_thread ? "another thread's per-thread default stream" : "another blocking stream"));
  CUstream new_owner = make_stream(c, 0);
  std::vector<CUdeviceptr> got;
  CUdeviceptr kept = 0;  // the first freed block to come back: left for a non-blocking stream
  bool written_again = false;  // a freed block came back to a new owner that writes it
  auto take = [&] {
    for (int i = 0; i < 48 && !(kept != 0 && written_again); ++i) {
      CUdeviceptr q = 0;
      REQUIRE(c.api.cuMemAlloc_v2(&q, n) == CUDA_SUCCESS);
      if (kept == 0 && freed.count(q) != 0) {
        kept = q;
        continue;
      }
      REQUIRE(c.launch_write(per_thread ? CU_STREAM_PER_THREAD : new_owner, q, n, 0x55, 0) == CUDA_SUCCESS);
      got.push_back(q);
      written_again = written_again || freed.count(q) != 0;
    }
  };
  if (per_thread) {
    std::thread other([&] {
      REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
      take();  // not synchronized here: that would wait for the late writes
    });
    other.join();
  } else {
    take();
  }
  // The late writes have not run yet, and freed blocks were handed out again.
  CHECK(c.api.cuEventQuery(late_done) == CUDA_ERROR_NOT_READY);
  REQUIRE(kept != 0);
  CHECK(written_again);
  // A non-blocking stream made now also runs behind the late writes.
  CUstream later = make_stream(c, CU_STREAM_NON_BLOCKING);
  REQUIRE(c.launch_write(later, kept, n, 0x77, 0) == CUDA_SUCCESS);
  REQUIRE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(all_equal(read_back(c, kept, n), 0x77));
  REQUIRE(c.api.cuMemFree_v2(kept) == CUDA_SUCCESS);
  for (CUdeviceptr q : got) {
    CHECK(all_equal(read_back(c, q, n), 0x55));
    REQUIRE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
  }
  REQUIRE(c.api.cuEventDestroy_v2(late_done) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(later) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(new_owner) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(old_owner) == CUDA_SUCCESS);
}

TEST_CASE("cudaMallocAsync / cudaFreeAsync are stream ordered", "[async]") {
  Client& c = client::client();
  const size_t n = 256 << 10;
  CUstream s1 = make_stream(c, CU_STREAM_NON_BLOCKING);
  CUstream s2 = make_stream(c, CU_STREAM_NON_BLOCKING);

  SECTION("reuse on the same stream is immediate and reaches no driver") {
    CUdeviceptr p = 0, q = 0;
    REQUIRE(c.api.cuMemAllocAsync(&p, n, s1) == CUDA_SUCCESS);
    REQUIRE(c.launch_sleep(s1, 20000) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemFreeAsync(p, s1) == CUDA_SUCCESS);
    c.reset_stats();
    REQUIRE(c.api.cuMemAllocAsync(&q, n, s1) == CUDA_SUCCESS);
    CHECK(q == p);
    const auto s = c.snapshot();
    CHECK(s.mem_alloc + s.mem_alloc_async == 0);
    REQUIRE(c.api.cuMemFreeAsync(q, s1) == CUDA_SUCCESS);
  }
  SECTION("another stream waits for the free's point in its stream") {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAllocAsync(&p, n, s1) == CUDA_SUCCESS);
    REQUIRE(c.launch_write(s1, p, n, 0xAA, 30000) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemFreeAsync(p, s1) == CUDA_SUCCESS);
    std::vector<CUdeviceptr> got;
    for (int i = 0; i < 3; ++i) {
      CUdeviceptr q = 0;
      REQUIRE(c.api.cuMemAllocAsync(&q, n, s2) == CUDA_SUCCESS);
      REQUIRE(c.api.cuMemsetD8_v2(q, 0x55, n) == CUDA_SUCCESS);
      got.push_back(q);
    }
    REQUIRE(c.api.cuStreamSynchronize(s1) == CUDA_SUCCESS);
    for (CUdeviceptr q : got) {
      CHECK(all_equal(read_back(c, q, n), 0x55));
      REQUIRE(c.api.cuMemFreeAsync(q, s2) == CUDA_SUCCESS);
    }
  }
  SECTION("frees cross the two paths both ways") {
    CUdeviceptr p = 0, q = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    CHECK(c.api.cuMemFreeAsync(p, s1) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemAllocAsync(&q, n, s2) == CUDA_SUCCESS);
    CHECK(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
    CHECK(c.api.cuMemFree_v2(q) == CUDA_ERROR_INVALID_VALUE);
    CHECK(c.api.cuMemFreeAsync(p, s1) == CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("the per-thread variants key the calling thread's stream") {
    CUdeviceptr p = 0, q = 0;
    REQUIRE(c.api.cuMemAllocAsync_ptsz(&p, n, nullptr) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemFreeAsync_ptsz(p, nullptr) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemAllocAsync(&q, n, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
    CHECK(q == p);  // the same stream: immediate reuse
    REQUIRE(c.api.cuMemFreeAsync(q, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  }
  REQUIRE(c.api.cuStreamSynchronize(s1) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamSynchronize(s2) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(s1) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(s2) == CUDA_SUCCESS);
}

TEST_CASE("capture: async calls become graph memory, frees are parked, the capture survives", "[capture]") {
  Client& c = client::client();
  CUstream s = make_stream(c, CU_STREAM_NON_BLOCKING);
  CUdeviceptr mine = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&mine, 4096) == CUDA_SUCCESS);
  c.reset_stats();
  REQUIRE(c.api.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUdeviceptr g = 0;
  REQUIRE(c.api.cuMemAllocAsync(&g, 1 << 20, s) == CUDA_SUCCESS);
  CHECK(c.snapshot().mem_alloc_async == 1);  // passed through: a graph memory node
  REQUIRE(c.api.cuMemFreeAsync(g, s) == CUDA_SUCCESS);
  CHECK(c.snapshot().mem_free_async == 1);
  CHECK(c.api.cuMemFree_v2(mine) == CUDA_SUCCESS);            // parked
  CHECK(c.api.cuMemFree_v2(mine) == CUDA_ERROR_INVALID_VALUE);  // still a double free
  CHECK(c.api.cuMemFree_v2(mine + 512) == CUDA_ERROR_INVALID_VALUE);
  CUgraph graph = nullptr;
  REQUIRE(c.api.cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);  // not invalidated
  CHECK(graph != nullptr);
  const auto st = c.snapshot();
  CHECK(st.mem_alloc == 0);
  CHECK(st.mem_free == 0);
  CHECK(st.ctx_sync == 0);
  // The parked free ran when the capture ended.
  CHECK(c.api.cuMemFree_v2(mine) == CUDA_ERROR_INVALID_VALUE);
  auto* graph_destroy = c.get<CUresult (*)(CUgraph)>("cuGraphDestroy");
  if (graph_destroy) graph_destroy(graph);
  REQUIRE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

TEST_CASE("capture: a miss outside the capturing stream cuts new memory and leaves the capture intact",
          "[capture]") {
  // The driver forbids cuMemAlloc in global capture mode (it would fail, and invalidate the
  // capture); cudalloc's own segment calls run relaxed. cudaMallocAsync on another stream is
  // legal natively; cudaMalloc is served too, as a cached one already is.
  Client& c = client::client();
  CUstream s = make_stream(c, CU_STREAM_NON_BLOCKING);
  CUstream other = make_stream(c, CU_STREAM_NON_BLOCKING);
  REQUIRE(c.api.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUdeviceptr a = 0, b = 0;
  CHECK(c.api.cuMemAllocAsync(&a, (40 << 20) + 4096, other) == CUDA_SUCCESS);  // nothing cached fits
  CHECK(c.api.cuMemAlloc_v2(&b, (72 << 20) + 4096) == CUDA_SUCCESS);
  CUgraph graph = nullptr;
  CHECK(c.api.cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);  // not invalidated
  CHECK(a != 0);
  CHECK(b != 0);
  if (a != 0) CHECK(c.api.cuMemFreeAsync(a, other) == CUDA_SUCCESS);
  if (b != 0) CHECK(c.api.cuMemFree_v2(b) == CUDA_SUCCESS);
  auto* graph_destroy = c.get<CUresult (*)(CUgraph)>("cuGraphDestroy");
  if (graph_destroy && graph) graph_destroy(graph);
  REQUIRE(c.api.cuStreamSynchronize(other) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(other) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

TEST_CASE("IPC of a block that starts its segment works; of a sub-allocated block it fails", "[ipc]") {
  Client& c = client::client();
  CUdeviceptr big = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&big, 64 << 20) == CUDA_SUCCESS);  // its own segment
  CUipcMemHandle h{};
  CHECK(c.api.cuIpcGetMemHandle(&h, big) == CUDA_SUCCESS);
  std::vector<CUdeviceptr> small;
  bool refused = false;
  for (int i = 0; i < 8; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    small.push_back(p);
    CUdeviceptr base = 0;
    size_t size = 0;
    REQUIRE(c.api.cuMemGetAddressRange_v2(&base, &size, p) == CUDA_SUCCESS);
    const CUresult r = c.api.cuIpcGetMemHandle(&h, p);
    if (r != CUDA_SUCCESS) {
      CHECK(r == CUDA_ERROR_INVALID_VALUE);
      refused = true;
    }
  }
  CHECK(refused);  // 8 small blocks share a segment: at least 7 are inside it
  for (CUdeviceptr p : small) REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemFree_v2(big) == CUDA_SUCCESS);
}

TEST_CASE("cudaDeviceReset drops the context's blocks", "[lifecycle]") {
  Client& c = client::client();
  CUdeviceptr p = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  CUdevice dev = 0;
  REQUIRE(c.api.cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  // cudaDeviceReset: the runtime resets the primary context, then uses it again.
  auto* reset = c.get<CUresult (*)(CUdevice)>("cuDevicePrimaryCtxReset");
  REQUIRE(is_cudalloc(reinterpret_cast<void*>(reset)));
  REQUIRE(reset(dev) == CUDA_SUCCESS);
  REQUIRE(c.api.cuDevicePrimaryCtxRetain(&c.ctx, dev) == CUDA_SUCCESS);
  REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CHECK(c.api.cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);  // dead, as natively
  c.reset_stats();
  CUdeviceptr q = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&q, 4096) == CUDA_SUCCESS);
  CHECK(c.snapshot().mem_alloc == 1);  // a fresh segment, not the dead one
  CHECK(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
}

namespace {

// `count` cudaMalloc'd pairs of `n` bytes with no work queued: the pointers handed out.
std::set<CUdeviceptr> quiet_pairs(Client& c, size_t n, int count) {
  std::set<CUdeviceptr> seen;
  for (int i = 0; i < count; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    seen.insert(p);
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
  return seen;
}

std::uint64_t fences_recorded(Client& c) { return c.call_count("cuCtxRecordEvent") + c.call_count("cuEventRecord"); }

}  // namespace

// A name of the runtime's kind, which a program may look up in a library of its own: not a
// driver entry point, whatever it contains.
extern "C" __attribute__((visibility("default"), used)) int cudaMemcpyProbe() { return 0; }

TEST_CASE("pairs with no work queued since a passed fence reuse one block and record no fence", "[watch]") {
  Client& c = client::client();
  for (const size_t n : {size_t{512}, size_t{64} << 10, size_t{4} << 20, size_t{64} << 20}) {
    INFO("bytes " << n);
    quiet_pairs(c, n, 300);  // the first batch is fenced and its fence passes
    c.reset_stats();
    CHECK(quiet_pairs(c, n, 2000).size() == 1);
    CHECK(fences_recorded(c) == 0);
    CHECK(c.snapshot().mem_alloc == 0);
  }
}

TEST_CASE("a kernel queued between a fence and a free keeps the block until it ran", "[watch][race]") {
  Client& c = client::client();
  CUstream nb = make_stream(c, CU_STREAM_NON_BLOCKING);
  const size_t n = 64 << 10;
  for (const bool per_thread_lookup : {false, true}) {
    INFO("launched through the per-thread lookup: " << per_thread_lookup);
    quiet_pairs(c, n, 300);
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    unsigned delay_us = 200000;
    unsigned char value = 0xAA;
    void* params[] = {&p, const_cast<size_t*>(&n), &value, &delay_us};
    const auto launch = c.get<Client::PFN_launch>("cuLaunchKernel", per_thread_lookup ? 2 : 0);
    using PFN_query = CUresult (*)(CUstream);
    const auto query = c.get<PFN_query>("cuStreamQuery");
    REQUIRE(query != nullptr);
    REQUIRE(launch(c.write_kernel, 1, 1, 1, 1, 1, 1, 0, nb, params, nullptr) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
    // However many quiet pairs follow, `p` is not handed out while the kernel is queued.
    int early = 0;
    for (int i = 0; i < 2000; ++i) {
      CUdeviceptr q = 0;
      REQUIRE(c.api.cuMemAlloc_v2(&q, n) == CUDA_SUCCESS);
      if (q == p && query(nb) == CUDA_ERROR_NOT_READY) ++early;
      REQUIRE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
    }
    CHECK(early == 0);
    REQUIRE(c.api.cuStreamSynchronize(nb) == CUDA_SUCCESS);
    // Once it ran, the quiet pairs settle on one block again, with no fence, as soon as the
    // fences queued before have been found passed (work of earlier cases on other streams of
    // the context may still hold them for a while).
    bool settled = false;
    for (int round = 0; round < 40 && !settled; ++round) {
      c.reset_stats();
      settled = quiet_pairs(c, n, 500).size() == 1 && fences_recorded(c) == 0;
    }
    CHECK(settled);
  }
  REQUIRE(c.api.cuStreamDestroy_v2(nb) == CUDA_SUCCESS);
}

TEST_CASE("every fake driver export that queues work is hooked, and resolving them all leaves the watch sighted",
          "[watch]") {
  Client& c = client::client();
  // The fake driver exports every symbol of the real one.
  static const char* const kExports[] = {
#define FK_EXPORT(name) #name,
#include "../fake_driver/fake_exports.inc"
#undef FK_EXPORT
  };
  int hooked = 0;
  for (const char* name : kExports) {
    void* p = dlsym(c.rt.handle, name);
    if (is_cudalloc(p)) ++hooked;
  }
  CHECK(hooked >= 158);
  void* self = dlopen(nullptr, RTLD_NOW);
  REQUIRE(self != nullptr);
  CHECK(dlsym(self, "cudaMemcpyProbe") != nullptr);
  quiet_pairs(c, 4096, 300);
  c.reset_stats();
  CHECK(quiet_pairs(c, 4096, 1000).size() == 1);
  CHECK(fences_recorded(c) == 0);
}

TEST_CASE("an entry point that queues work found past cudalloc makes every cudaFree wait for a fence",
          "[own-process][watch-blind]") {
  Client& c = client::client();
  quiet_pairs(c, 4096, 300);
  c.reset_stats();
  quiet_pairs(c, 4096, 1000);
  REQUIRE(fences_recorded(c) == 0);
  // A library loaded after cudalloc that finds the driver's own launch through RTLD_NEXT: its
  // kernels would go unseen.
  REQUIRE(dlsym(RTLD_NEXT, "cuLaunchKernel") != nullptr);
  c.reset_stats();
  quiet_pairs(c, 4096, 1000);
  CHECK(fences_recorded(c) > 0);
}
