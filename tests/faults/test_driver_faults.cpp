// Fault injection through the fake driver, with cudalloc preloaded: allocation failures at a
// chosen call, events that cannot be created or recorded, a context reset under live blocks,
// and (run with CUDALLOC_CONF=expandable_segments:true, tag [vm]) cuMemCreate / cuMemMap /
// cuMemSetAccess failing halfway. After every fault: the native error code, nothing leaked
// (fakecuda_stats), live blocks intact, and allocations work again once the fault clears.
#include "common.h"

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace faults;

namespace {

constexpr std::size_t kMiB = 1 << 20;

// A size no earlier test left in the cache, so that the allocation reaches the driver.
std::size_t fresh_size(std::size_t mib) {
  static std::size_t bump = 0;
  return mib * kMiB + (++bump) * 4096 + 7;
}

}  // namespace

TEST_CASE("cuMemAlloc failing at the chosen call: the ladder retries, then OUT_OF_MEMORY; no leak; serving resumes",
          "[oom]") {
  Client& c = client::client();
  Sentinel keep(c, 3 * kMiB + 100, 0x5a);

  SECTION("one failure is absorbed by the out-of-memory ladder (release cache, retry)") {
    c.reset_stats();
    c.fail_next("cuMemAlloc", 0, CUDA_ERROR_OUT_OF_MEMORY);
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, fresh_size(64)) == CUDA_SUCCESS);
    CHECK(c.call_count("cuMemAlloc") >= 2);
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
  SECTION("the failure comes at the third driver call") {
    std::vector<CUdeviceptr> got;
    c.fail_next("cuMemAlloc", 2, CUDA_ERROR_OUT_OF_MEMORY);
    for (int i = 0; i < 6; ++i) {
      CUdeviceptr p = 0;
      REQUIRE(c.api.cuMemAlloc_v2(&p, fresh_size(24)) == CUDA_SUCCESS);  // each needs a segment
      REQUIRE(c.api.cuMemsetD8_v2(p, static_cast<unsigned char>(i), 4096) == CUDA_SUCCESS);
      got.push_back(p);
    }
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK(all_equal(got[i], 4096, static_cast<unsigned char>(i)));
      REQUIRE(c.api.cuMemFree_v2(got[i]) == CUDA_SUCCESS);
    }
  }
  SECTION("every driver call fails: OUT_OF_MEMORY, nothing leaked, then it works again") {
    const auto before = c.snapshot();
    for (int i = 0; i < 64; ++i) c.fail_next("cuMemAlloc", 0, CUDA_ERROR_OUT_OF_MEMORY);
    CUdeviceptr p = 0xbad;
    CHECK(c.api.cuMemAlloc_v2(&p, fresh_size(300)) == CUDA_ERROR_OUT_OF_MEMORY);
    CUdeviceptr q = 0xbad;
    CHECK(c.api.cuMemAllocAsync(&q, fresh_size(300), nullptr) == CUDA_ERROR_OUT_OF_MEMORY);
    const auto during = c.snapshot();
    CHECK(during.bytes_in_use <= before.bytes_in_use);  // the ladder may have released cache
    CHECK(during.live_allocations <= before.live_allocations);
    clear_failures()();
    CHECK(keep.intact());
    REQUIRE(c.api.cuMemAlloc_v2(&p, fresh_size(300)) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemsetD8_v2(p, 0x11, 300 * kMiB) == CUDA_SUCCESS);
    CHECK(all_equal(p, 300 * kMiB, 0x11));
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
  SECTION("a driver error other than out-of-memory is passed on as is, and nothing is released for it") {
    for (int i = 0; i < 64; ++i) c.fail_next("cuMemAlloc", 0, CUDA_ERROR_ECC_UNCORRECTABLE);
    CUdeviceptr p = 0xbad;
    const std::uint64_t calls = c.call_count("cuMemAlloc");
    const std::uint64_t frees = c.call_count("cuMemFree");
    const CUresult r = c.api.cuMemAlloc_v2(&p, fresh_size(900));  // larger than anything cached
    clear_failures()();
    CHECK(r == CUDA_ERROR_ECC_UNCORRECTABLE);
    CHECK(c.call_count("cuMemAlloc") == calls + 1);  // not retried: the ladder cannot help
    CHECK(c.call_count("cuMemFree") == frees);       // and no cached segment was given back
    REQUIRE(c.api.cuMemAlloc_v2(&p, fresh_size(900)) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
  clear_failures()();
  CHECK(keep.intact());
}

// Reuse-before-completion check: a block with a late write queued on a non-blocking stream is
// freed; the next owners fill their blocks with 0x55; if the allocator handed the block out
// before the write ran, the write lands in an owner's block.
static void late_write_round(Client& c, CUstream nb, const char* fail_api, CUresult code, bool destroy_stream,
                             int failures = 8, std::size_t n = 1 * kMiB, unsigned delay_us = 40000) {
  CUdeviceptr p = 0;
  REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
  REQUIRE(c.launch_write(nb, p, n, 0xAA, delay_us) == CUDA_SUCCESS);  // runs 40 ms (default) from now
  for (int i = 0; i < failures; ++i) c.fail_next(fail_api, 0, code);
  const std::uint64_t records = c.call_count("cuEventRecord"), creates = c.call_count("cuEventCreate");
  if (destroy_stream) REQUIRE(c.api.cuStreamDestroy_v2(nb) == CUDA_SUCCESS);
  if (destroy_stream && std::getenv("FAULTS_DEBUG")) {
    std::fprintf(stderr, "destroy: %llu event records, %llu creates\n",
                 (unsigned long long)(c.call_count("cuEventRecord") - records),
                 (unsigned long long)(c.call_count("cuEventCreate") - creates));
  }
  REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  std::vector<CUdeviceptr> got;
  for (int i = 0; i < 6; ++i) {
    CUdeviceptr q = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&q, n) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemsetD8_v2(q, 0x55, n) == CUDA_SUCCESS);
    got.push_back(q);
  }
  clear_failures()();
  if (std::getenv("FAULTS_DEBUG")) {
    int reused = 0;
    for (CUdeviceptr q : got) reused += q < p + n && p < q + n;
    std::fprintf(stderr, "round: %d of %zu new blocks overlap the freed one\n", reused, got.size());
  }
  std::this_thread::sleep_for(std::chrono::microseconds(2 * delay_us));
  if (!destroy_stream) REQUIRE(c.api.cuStreamSynchronize(nb) == CUDA_SUCCESS);
  for (CUdeviceptr q : got) {
    CHECK(all_equal(q, n, 0x55));
    REQUIRE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
  }
}

TEST_CASE("events that cannot be created or recorded: fences fall back, no reuse before completion", "[events]") {
  Client& c = client::client();
  Sentinel keep(c, 8192, 0x3c);
  for (const char* api : {"cuEventRecord", "cuEventCreate"}) {
    INFO(api);
    for (int round = 0; round < 3; ++round) {
      CUstream nb = make_stream(c, CU_STREAM_NON_BLOCKING);
      late_write_round(c, nb, api, CUDA_ERROR_UNKNOWN, false, 8, round == 0 ? kMiB : 6 * kMiB);
      REQUIRE(c.api.cuStreamDestroy_v2(nb) == CUDA_SUCCESS);
    }
  }
  CHECK(keep.intact());
}

TEST_CASE("a non-blocking stream destroyed with queued work while events keep failing: no reuse before completion",
          "[events][destroy]") {
  Client& c = client::client();
  for (const char* api : {"cuEventRecord", "cuEventCreate"}) {
    INFO(api);
    for (std::size_t n : {kMiB, 6 * kMiB}) {
      CUstream nb = make_stream(c, CU_STREAM_NON_BLOCKING);
      late_write_round(c, nb, api, CUDA_ERROR_UNKNOWN, true, 8, n);
    }
  }
}

// Regression (driver/driver_backend.cpp, DriverBackend::remove_stream): when the event that
// marks a destroyed non-blocking stream's last work could not be recorded, the stream left the
// device fence's list without it, so a block freed afterwards could be reused while the
// destroyed stream's queued kernel still wrote to it (seen once: a 6 MiB block overwritten).
// remove_stream now synchronizes the stream in that case.
TEST_CASE("a single failed cuEventRecord at cuStreamDestroy: no reuse under a pending write",
          "[destroy]") {
  Client& c = client::client();
  for (int round = 0; round < 3; ++round) {
    CUstream nb = make_stream(c, CU_STREAM_NON_BLOCKING);
    late_write_round(c, nb, "cuEventRecord", CUDA_ERROR_UNKNOWN, false, 8, round == 0 ? kMiB : 6 * kMiB);
    REQUIRE(c.api.cuStreamDestroy_v2(nb) == CUDA_SUCCESS);
  }
  for (int i = 0; i < 10; ++i) {
    for (std::size_t n : {kMiB, 6 * kMiB}) {
      CUstream nb = make_stream(c, CU_STREAM_NON_BLOCKING);
      late_write_round(c, nb, "cuEventRecord", CUDA_ERROR_UNKNOWN, true, 1, n);
    }
  }
}

TEST_CASE("a context reset under live blocks: old pointers are invalid, new allocations work, nothing leaks",
          "[context]") {
  Client& c = client::client();
  std::vector<CUdeviceptr> old;
  for (std::size_t n : {512ul, 4096ul, 3 * kMiB, 40 * kMiB}) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    old.push_back(p);
  }
  CUstream s = make_stream(c, CU_STREAM_NON_BLOCKING);
  CUdeviceptr a = 0;
  REQUIRE(c.api.cuMemAllocAsync(&a, 2 * kMiB, s) == CUDA_SUCCESS);
  old.push_back(a);
  CUdevice dev = 0;
  REQUIRE(c.api.cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  auto* reset = c.get<CUresult (*)(CUdevice)>("cuDevicePrimaryCtxReset");
  REQUIRE(reset != nullptr);
  REQUIRE(reset(dev) == CUDA_SUCCESS);
  const auto after_reset = c.snapshot();
  CHECK(after_reset.live_allocations == 0);  // the driver freed the context's memory
  CHECK(after_reset.bytes_in_use == 0);
  REQUIRE(c.api.cuDevicePrimaryCtxRetain(&c.ctx, dev) == CUDA_SUCCESS);
  REQUIRE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  for (CUdeviceptr p : old) {
    CHECK(c.api.cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
    CHECK(c.api.cuMemFreeAsync(p, nullptr) == CUDA_ERROR_INVALID_VALUE);
  }
  std::vector<CUdeviceptr> fresh;
  for (std::size_t n : {512ul, 4096ul, 3 * kMiB, 40 * kMiB}) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemsetD8_v2(p, 0x77, n) == CUDA_SUCCESS);
    CHECK(all_equal(p, n, 0x77));
    fresh.push_back(p);
  }
  for (CUdeviceptr p : fresh) REQUIRE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
}

// --- expandable segments (CUDALLOC_CONF=expandable_segments:true)

TEST_CASE("cuMemCreate / cuMemMap / cuMemSetAccess failing halfway: exact rollback, then serving resumes", "[vm]") {
  Client& c = client::client();
  Sentinel keep(c, 5 * kMiB, 0x42);
  CUstream s = make_stream(c, CU_STREAM_NON_BLOCKING);
  for (const char* api : {"cuMemCreate", "cuMemMap", "cuMemSetAccess"}) {
    for (int after : {0, 1, 3}) {
      INFO(api << " fails after " << after << " successful calls");
      const auto before = c.snapshot();
      const std::uint64_t maps_before = c.call_count("cuMemMap");
      // Many failures: the whole ladder sees them.
      for (int i = 0; i < 64; ++i) c.fail_next(api, i == 0 ? after : 0, CUDA_ERROR_OUT_OF_MEMORY);
      CUdeviceptr p = 0xbad;
      const CUresult r = c.api.cuMemAllocAsync(&p, fresh_size(64), s);  // needs 32+ granules
      clear_failures()();
      if (r == CUDA_SUCCESS) {
        REQUIRE(c.api.cuMemFreeAsync(p, s) == CUDA_SUCCESS);
      } else {
        CHECK(r == CUDA_ERROR_OUT_OF_MEMORY);
        const auto after_fault = c.snapshot();
        // Every handle created by a failed map was released; every mapping unmapped.
        CHECK(after_fault.live_vm_handles <= before.live_vm_handles);
        CHECK(after_fault.bytes_in_use <= before.bytes_in_use);
        CHECK(c.call_count("cuMemMap") >= maps_before);
      }
      CHECK(keep.intact());
      // Serving resumes.
      CUdeviceptr q = 0;
      REQUIRE(c.api.cuMemAllocAsync(&q, fresh_size(64), s) == CUDA_SUCCESS);
      REQUIRE(c.launch_write(s, q, 64 * kMiB, 0x66, 0) == CUDA_SUCCESS);
      REQUIRE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
      CHECK(all_equal(q, 64 * kMiB, 0x66));
      REQUIRE(c.api.cuMemFreeAsync(q, s) == CUDA_SUCCESS);
    }
  }
  REQUIRE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

TEST_CASE("the driver backend's map() rolls back exactly what it did (stats return to their values)", "[vm]") {
  Client& c = client::client();
  // Exactly one failure at a chosen step of one map() (create -> map -> set access): the
  // handle counts of the fake driver must return to where they were, and the allocation either
  // succeeds through the ladder or fails cleanly.
  for (const char* api : {"cuMemMap", "cuMemSetAccess"}) {
    INFO(api);
    CUstream s = make_stream(c, CU_STREAM_NON_BLOCKING);
    CUdeviceptr warm = 0;
    REQUIRE(c.api.cuMemAllocAsync(&warm, 4 * kMiB, s) == CUDA_SUCCESS);
    const auto before = c.snapshot();
    const std::uint64_t creates = c.call_count("cuMemCreate"), releases = c.call_count("cuMemRelease");
    c.fail_next(api, 0, CUDA_ERROR_OUT_OF_MEMORY);
    CUdeviceptr p = 0;
    const CUresult r = c.api.cuMemAllocAsync(&p, fresh_size(10), s);
    clear_failures()();
    const auto after = c.snapshot();
    const std::uint64_t created = c.call_count("cuMemCreate") - creates;
    const std::uint64_t released = c.call_count("cuMemRelease") - releases;
    CHECK(created >= 1);
    CHECK(released >= 1);  // the failed map's handle
    if (r == CUDA_SUCCESS) {
      CHECK(after.live_vm_handles == before.live_vm_handles + created - released);
      REQUIRE(c.api.cuMemFreeAsync(p, s) == CUDA_SUCCESS);
    } else {
      CHECK(after.live_vm_handles == before.live_vm_handles - released + created - 0);
    }
    REQUIRE(c.api.cuMemFreeAsync(warm, s) == CUDA_SUCCESS);
    REQUIRE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
    REQUIRE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
  }
}

namespace {

// Gives every idle byte of cudalloc's back to the device (cudaMemPoolTrimTo(default pool, 0)).
void trim_all(Client& c) {
  CUmemoryPool pool = nullptr;
  auto trim = client::default_pool_trim(c, &pool);
  REQUIRE(trim != nullptr);
  REQUIRE(trim(pool, 0) == CUDA_SUCCESS);
}

// Two growths of one stream's expandable segment (two map() calls), freed, then the idle memory
// trimmed while `api` fails `after` calls in; then the same sizes again, written end to end.
// (The allocator unmaps one map() at a time, so a failing cuMemUnmap keeps its chunk mapped
// and counted, and this checks cuMemRelease.)
void unmap_fault(Client& c, const char* api, int after) {
  CUstream s = make_stream(c, CU_STREAM_NON_BLOCKING);
  CUdeviceptr a = 0, b = 0;
  REQUIRE(c.api.cuMemAllocAsync(&a, 24 * kMiB, s) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemAllocAsync(&b, 40 * kMiB, s) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemFreeAsync(a, s) == CUDA_SUCCESS);
  REQUIRE(c.api.cuMemFreeAsync(b, s) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
  const std::uint64_t unmaps = c.call_count("cuMemUnmap");
  for (int i = 0; i < 64; ++i) c.fail_next(api, i == 0 ? after : 0, CUDA_ERROR_UNKNOWN);
  trim_all(c);
  clear_failures()();
  CHECK(c.call_count("cuMemUnmap") > unmaps);  // the fault was met
  for (std::size_t bytes : {24 * kMiB, 40 * kMiB, 64 * kMiB}) {
    CUdeviceptr p = 0;
    REQUIRE(c.api.cuMemAllocAsync(&p, bytes, s) == CUDA_SUCCESS);
    CHECK(c.launch_write(s, p, bytes, 0x77, 0) == CUDA_SUCCESS);  // every byte of it mapped
    REQUIRE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(all_equal(p, bytes, 0x77));
    REQUIRE(c.api.cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  }
  REQUIRE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
  REQUIRE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
  trim_all(c);
}

}  // namespace

TEST_CASE("cuMemRelease failing after an unmap: the range is given up, never handed out unmapped", "[vm]") {
  unmap_fault(client::client(), "cuMemRelease", 0);
}
