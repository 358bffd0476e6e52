// CUDALLOC_CONF=single_stream:true through the fake driver, one scenario per process (the mode
// ends for good once another stream is seen):
//   reuse          legacy stream only: a cudaFree'd block serves the next allocation at once,
//                  from any thread, with no device fence, and its late legacy work cannot
//                  reach the next owner's data
//   non_blocking   a non-blocking stream created after such a reuse waits for the legacy work
//                  queued before it; cudaFree'd blocks are fenced again from then on
//   blocking       a blocking stream (a library's helper) keeps the mode: a block whose last
//                  owner wrote it there late is reused at once, and the legacy stream orders
//                  the next owner's work after that write; the stream in a memory call ends it
//   helper         a non-blocking stream made by a library that forks and joins its own
//                  streams (tests/interpose/forkjoin_helper.cpp) keeps the mode: work forked
//                  onto it and joined back is ordered before the next owner's; a non-blocking
//                  stream the program makes ends it
//   per_thread     a per-thread default stream in a memory call ends the mode
//   second_context a second context ends the mode
// Run without single_stream ("reuse fenced"), the first scenario's reuse happens only behind a
// device fence recorded after the free.
#include <dlfcn.h>

#include <cstring>
#include <thread>
#include <vector>

#include "client.h"

// tests/interpose/forkjoin_helper.cpp
extern "C" int forkjoin_make_stream(CUresult (*create)(CUstream*, unsigned), CUstream* out);

namespace {

constexpr size_t kBytes = 1 << 20;       // small pool: served from the thread's own cache
constexpr size_t kLargeBytes = 4 << 20;  // large pool: served under the device lock

client::Client& c() { return client::client(); }

bool all_equal(CUdeviceptr p, unsigned char x, size_t bytes = kBytes) {
  std::vector<unsigned char> host(bytes);
  CHECK_OR_DIE(c().api.cuMemcpyDtoH_v2(host.data(), p, bytes) == CUDA_SUCCESS);
  for (unsigned char b : host) {
    if (b != x) return false;
  }
  return true;
}

CUdeviceptr alloc(size_t bytes = kBytes) {
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c().api.cuMemAlloc_v2(&p, bytes) == CUDA_SUCCESS);
  return p;
}

// A block whose last owner left a write of 0xAA queued on the legacy stream, `delay_us` from
// now, then freed it. Returns the block's address.
CUdeviceptr free_with_late_write(unsigned delay_us, size_t bytes = kBytes) {
  const CUdeviceptr p = alloc(bytes);
  CHECK_OR_DIE(c().launch_write(nullptr, p, bytes, 0xAA, delay_us) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuMemFree_v2(p) == CUDA_SUCCESS);
  return p;
}

// The mode is on: the freed block comes back at once.
void expect_reuse() {
  const CUdeviceptr p = free_with_late_write(30000);
  const CUdeviceptr q = alloc();
  CHECK_OR_DIE(q == p);
  CHECK_OR_DIE(c().api.cuMemFree_v2(q) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuCtxSynchronize() == CUDA_SUCCESS);
}

// The mode is off: the freed block waits for its late write.
// The next owner's legacy work runs after the last owner's late write: its bytes stay. Frees q.
void expect_own_bytes(CUdeviceptr q) {
  CHECK_OR_DIE(c().api.cuMemsetD8_v2(q, 0x55, kBytes) == CUDA_SUCCESS);
  CHECK_OR_DIE(all_equal(q, 0x55));
  CHECK_OR_DIE(c().api.cuMemFree_v2(q) == CUDA_SUCCESS);
}

// Frees p, whose last write is still queued but ordered before the legacy stream's next work:
// the next allocation gets the same block at once, and keeps its own bytes.
void expect_ordered_reuse(CUdeviceptr p) {
  CHECK_OR_DIE(c().api.cuMemFree_v2(p) == CUDA_SUCCESS);
  const CUdeviceptr q = alloc();
  CHECK_OR_DIE(q == p);
  expect_own_bytes(q);
}

// The mode is off: the freed block comes back only behind a device fence recorded after its
// free. While no non-blocking stream exists that fence orders reuse, and the block may come
// back at once: the next owner's legacy work then runs after the late write, and its bytes stay.
void expect_fenced() {
  const auto records = c().call_count("cuEventRecord");
  const CUdeviceptr p = free_with_late_write(30000);
  const CUdeviceptr q = alloc();
  if (q == p) {
    CHECK_OR_DIE(c().call_count("cuEventRecord") > records);
    expect_own_bytes(q);
  } else {
    CHECK_OR_DIE(c().api.cuMemFree_v2(q) == CUDA_SUCCESS);
  }
  CHECK_OR_DIE(c().api.cuCtxSynchronize() == CUDA_SUCCESS);
}

void reuse(bool configured) {
  c().reset_stats();
  if (!configured) {
    expect_fenced();  // without the promise, the block waits behind a fence
    return;
  }
  const CUdeviceptr p = free_with_late_write(30000);
  const CUdeviceptr q = alloc();
  CHECK_OR_DIE(q == p);
  expect_own_bytes(q);
  // Another thread gets the block just as well once the freeing thread has exited (while it
  // lives, the block stays parked in its cache for its own next request).
  CUdeviceptr r = 0;
  std::thread freeing([&] {
    CHECK_OR_DIE(c().api.cuCtxSetCurrent(c().ctx) == CUDA_SUCCESS);
    r = free_with_late_write(20000, kLargeBytes);
  });
  freeing.join();
  CUdeviceptr got = 0;
  std::thread other([&] {
    CHECK_OR_DIE(c().api.cuCtxSetCurrent(c().ctx) == CUDA_SUCCESS);
    got = alloc(kLargeBytes);
    CHECK_OR_DIE(c().api.cuMemsetD8_v2(got, 0x66, kLargeBytes) == CUDA_SUCCESS);
  });
  other.join();
  CHECK_OR_DIE(got == r);
  CHECK_OR_DIE(all_equal(got, 0x66, kLargeBytes));
  CHECK_OR_DIE(c().api.cuMemFree_v2(got) == CUDA_SUCCESS);
  // A GPU far behind the host does not make the cache grow: 200 rounds of each size, one
  // segment of each pool.
  for (int i = 0; i < 200; ++i) {
    free_with_late_write(100);
    free_with_late_write(100, kLargeBytes);
  }
  CHECK_OR_DIE(c().call_count("cuMemAlloc") == 2);
  CHECK_OR_DIE(c().call_count("cuEventRecord") == 0);  // no device fence
  CHECK_OR_DIE(c().api.cuCtxSynchronize() == CUDA_SUCCESS);
}

void non_blocking() {
  // Reused in the ordered era, with the last owner's write still queued on the legacy stream.
  const CUdeviceptr p = free_with_late_write(50000);
  const CUdeviceptr q = alloc();
  CHECK_OR_DIE(q == p);
  CUstream nb = nullptr;
  CHECK_OR_DIE(c().api.cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  // Without the wait cudalloc puts on the new stream, this write would run at once and the
  // late 0xAA would land over it.
  CHECK_OR_DIE(c().launch_write(nb, q, kBytes, 0x55, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuStreamSynchronize(nb) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK_OR_DIE(all_equal(q, 0x55));
  CHECK_OR_DIE(c().api.cuMemFree_v2(q) == CUDA_SUCCESS);
  // From now on a late write on the non-blocking stream keeps its block from the next owners.
  const CUdeviceptr r = alloc();
  CHECK_OR_DIE(c().launch_write(nb, r, kBytes, 0xAA, 30000) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuMemFree_v2(r) == CUDA_SUCCESS);
  std::vector<CUdeviceptr> next;
  for (int i = 0; i < 4; ++i) {
    next.push_back(alloc());
    CHECK_OR_DIE(c().api.cuMemsetD8_v2(next.back(), 0x55, kBytes) == CUDA_SUCCESS);
  }
  CHECK_OR_DIE(c().api.cuStreamSynchronize(nb) == CUDA_SUCCESS);
  for (CUdeviceptr x : next) {
    CHECK_OR_DIE(all_equal(x, 0x55));
    CHECK_OR_DIE(c().api.cuMemFree_v2(x) == CUDA_SUCCESS);
  }
  CHECK_OR_DIE(c().api.cuStreamDestroy_v2(nb) == CUDA_SUCCESS);
}

void blocking() {
  CUstream helper = nullptr;
  CHECK_OR_DIE(c().api.cuStreamCreate(&helper, 0) == CUDA_SUCCESS);
  expect_reuse();
  // Forked onto the helper and left there: the legacy stream waits for it by itself.
  const CUdeviceptr p = alloc();
  CHECK_OR_DIE(c().launch_write(helper, p, kBytes, 0xAA, 30000) == CUDA_SUCCESS);
  expect_ordered_reuse(p);
  // The program's own work on it (seen in a memory call) ends the mode.
  CUdeviceptr a = 0;
  CHECK_OR_DIE(c().api.cuMemAllocAsync(&a, 4096, helper) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuMemFreeAsync(a, helper) == CUDA_SUCCESS);
  expect_fenced();
  CHECK_OR_DIE(c().api.cuStreamDestroy_v2(helper) == CUDA_SUCCESS);
}

void helper() {
  CUstream hs = nullptr;
  CHECK_OR_DIE(forkjoin_make_stream(c().api.cuStreamCreate, &hs) == 0);
  expect_reuse();
  // Fork onto the helper stream, write late there, join back, then free: the join orders the
  // next owner's legacy work after the write.
  using WaitFn = CUresult (*)(CUstream, CUevent, unsigned);
  const auto wait = reinterpret_cast<WaitFn>(dlsym(c().rt.handle, "cuStreamWaitEvent"));
  CHECK_OR_DIE(wait != nullptr);
  CUevent fork = nullptr, join = nullptr;
  CHECK_OR_DIE(c().api.cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuEventCreate(&join, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  const CUdeviceptr p = alloc();
  CHECK_OR_DIE(c().api.cuEventRecord(fork, CU_STREAM_LEGACY) == CUDA_SUCCESS);
  CHECK_OR_DIE(wait(hs, fork, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().launch_write(hs, p, kBytes, 0xAA, 30000) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuEventRecord(join, hs) == CUDA_SUCCESS);
  CHECK_OR_DIE(wait(CU_STREAM_LEGACY, join, 0) == CUDA_SUCCESS);
  expect_ordered_reuse(p);
  // The program's own non-blocking stream ends the mode.
  CUstream own = nullptr;
  CHECK_OR_DIE(c().api.cuStreamCreate(&own, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  expect_fenced();
  for (CUstream x : {hs, own}) CHECK_OR_DIE(c().api.cuStreamDestroy_v2(x) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuEventDestroy_v2(fork) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuEventDestroy_v2(join) == CUDA_SUCCESS);
}

void per_thread() {
  expect_reuse();
  CUdeviceptr a = 0;
  CHECK_OR_DIE(c().api.cuMemAllocAsync_ptsz(&a, 4096, nullptr) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuMemFree_v2(a) == CUDA_SUCCESS);
  expect_fenced();
}

void second_context() {
  expect_reuse();
  CUdevice dev1 = 0;
  CUcontext ctx1 = nullptr;
  CHECK_OR_DIE(c().api.cuDeviceGet(&dev1, 1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuDevicePrimaryCtxRetain(&ctx1, dev1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  const CUdeviceptr b = alloc();
  CHECK_OR_DIE(c().api.cuMemFree_v2(b) == CUDA_SUCCESS);
  CHECK_OR_DIE(c().api.cuCtxSetCurrent(c().ctx) == CUDA_SUCCESS);
  expect_fenced();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "reuse") {
    reuse(!(argc > 2 && std::strcmp(argv[2], "fenced") == 0));
  } else if (scenario == "non_blocking") {
    non_blocking();
  } else if (scenario == "blocking") {
    blocking();
  } else if (scenario == "helper") {
    helper();
  } else if (scenario == "per_thread") {
    per_thread();
  } else if (scenario == "second_context") {
    second_context();
  } else {
    client::die("usage: single_stream reuse [fenced]|non_blocking|blocking|helper|per_thread|second_context");
  }
  std::fprintf(stderr, "single_stream %s: ok\n", scenario.c_str());
  return 0;
}
