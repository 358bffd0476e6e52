// Pinned host memory served by cudalloc's host cache, through the fake driver, one scenario per
// process (each counts the driver's calls from a clean start):
//   pairs        a cudaHostAlloc/cudaFreeHost loop (and cuMemAllocHost) reaches the driver no more
//   flags        a block only ever serves requests with its own flags; cuMemHostGetFlags says them
//   fence        a freed block is not reused while device work queued before its free may still
//                use it (legacy and non-blocking streams), and the free does not wait for it
//   bad_free     unknown, interior and double frees: CUDA_ERROR_INVALID_VALUE, nothing lost
//   passthrough  (CUDALLOC_NO_CACHING=1) every call reaches the driver
//   attributes   pointer queries answer for the block, not for the driver allocation around it
//   limit        (pinned_memory_limit_mb:8) idle memory goes first, then the request fails
//   trim         cudaMemPoolTrimTo gives idle pinned memory back
//   oom          a driver out-of-memory: the cache is given back and the request retried
//   ctx_destroy  a created context allocates 3 device blocks and a host block and is destroyed
//                (its statistics are printed then: host_check.py); the primary context allocates
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "client.h"

using client::Client;
using client::proc;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

using HostAllocFn = CUresult (*)(void**, size_t, unsigned);
using AllocHostFn = CUresult (*)(void**, size_t);
using FreeHostFn = CUresult (*)(void*);
using GetFlagsFn = CUresult (*)(unsigned*, void*);
using GetDevPtrFn = CUresult (*)(CUdeviceptr*, void*, unsigned);
using AttrsFn = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);

struct Host {
  Client& c;
  HostAllocFn alloc = c.get<HostAllocFn>("cuMemHostAlloc");
  FreeHostFn free = c.get<FreeHostFn>("cuMemFreeHost");
  GetFlagsFn flags = c.get<GetFlagsFn>("cuMemHostGetFlags");
  GetDevPtrFn devptr = c.get<GetDevPtrFn>("cuMemHostGetDevicePointer");
  explicit Host(Client& cl) : c(cl) {
    CHECK_OR_DIE(alloc != nullptr && free != nullptr && flags != nullptr && devptr != nullptr);
  }
  void* get(std::size_t n, unsigned f = 0) {
    void* p = nullptr;
    CHECK_OR_DIE(alloc(&p, n, f) == CUDA_SUCCESS && p != nullptr);
    return p;
  }
  void put(void* p) { CHECK_OR_DIE(free(p) == CUDA_SUCCESS); }
};

int pairs(Client& c) {
  Host h(c);
  // The hooks are what the runtime got.
  CHECK_OR_DIE(client::is_cudalloc(reinterpret_cast<const void*>(h.alloc)));
  CHECK_OR_DIE(client::is_cudalloc(reinterpret_cast<const void*>(h.free)));
  auto alloc_host = proc<AllocHostFn>(c, "cuMemAllocHost", 3020);
  CHECK_OR_DIE(client::is_cudalloc(reinterpret_cast<const void*>(alloc_host)));
  for (int i = 0; i < 3; ++i) {
    void* a = h.get(4 * KiB);
    void* b = h.get(3 * MiB);
    h.put(a);
    h.put(b);
  }
  c.reset_stats();
  for (int i = 0; i < 1000; ++i) {
    void* a = h.get(4 * KiB);
    void* b = h.get(3 * MiB, CU_MEMHOSTALLOC_PORTABLE);
    void* d = nullptr;
    CHECK_OR_DIE(alloc_host(&d, 100 * KiB) == CUDA_SUCCESS);
    std::memset(a, i, 4 * KiB);
    std::memset(d, i, 100 * KiB);
    h.put(a);
    h.put(b);
    h.put(d);
  }
  const fakecuda_stats_t s = c.snapshot();
  std::fprintf(stderr, "pairs: %llu driver allocations, %llu driver frees in 1000 rounds\n",
               static_cast<unsigned long long>(s.host_alloc), static_cast<unsigned long long>(s.host_free));
  // The first round of the portable and cuMemAllocHost sizes makes their segments; then nothing.
  CHECK_OR_DIE(s.host_alloc <= 2);
  CHECK_OR_DIE(s.host_free == 0);
  return 0;
}

int flags(Client& c) {
  Host h(c);
  std::map<void*, unsigned> handed;  // every block handed out, with its request's flags
  auto take = [&](std::size_t n, unsigned f) {
    void* p = h.get(n, f);
    auto it = handed.find(p);
    CHECK_OR_DIE(it == handed.end() || it->second == f);  // never another flag set's block
    handed[p] = f;
    unsigned got = 99;
    CHECK_OR_DIE(h.flags(&got, p) == CUDA_SUCCESS && got == f);
    CHECK_OR_DIE(h.flags(&got, static_cast<char*>(p) + 123) == CUDA_SUCCESS && got == f);
    return p;
  };
  std::vector<void*> live;
  std::set<void*> large;
  for (unsigned f = 0; f < 8; ++f) {
    large.insert(live.emplace_back(take(512 * KiB, f)));
    for (int i = 0; i < 3; ++i) live.push_back(take(8 * KiB, f));
  }
  for (void* p : live) h.put(p);
  live.clear();
  // Again, flag sets in the other order: each gets back its own blocks.
  for (unsigned f = 8; f-- > 0;) {
    CHECK_OR_DIE(large.count(live.emplace_back(take(512 * KiB, f))) == 1);
    // 8 KiB: the segment's other blocks, then (20 > 16) the freed ones and a new segment.
    for (int i = 0; i < 20; ++i) live.push_back(take(8 * KiB, f));
  }
  // The 512 KiB blocks (a segment each) came back: the check in take() had blocks to refuse.
  for (void* p : live) h.put(p);
  // Flags the driver does not know: its own error, nothing cached.
  void* p = nullptr;
  CHECK_OR_DIE(h.alloc(&p, 4096, 0x10) == CUDA_ERROR_INVALID_VALUE);
  return 0;
}

bool all(const void* p, std::size_t n, unsigned char v) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != v) return false;
  }
  return true;
}

// A "copy" into a freed block still queued on `stream` must not land on the block's next owner.
void fenced_reuse(Client& c, Host& h, CUstream stream, std::size_t n, int count) {
  std::vector<void*> old;
  for (int i = 0; i < count; ++i) old.push_back(h.get(n));
  const std::uint64_t allocs = c.snapshot().host_alloc;
  for (void* p : old) {
    // The writes run one after another: the last ends 300 ms from now.
    CHECK_OR_DIE(c.launch_write(stream, reinterpret_cast<CUdeviceptr>(p), n, 0xAA, 300000 / count) == CUDA_SUCCESS);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (void* p : old) h.put(p);
  const auto freed_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  CHECK_OR_DIE(freed_ms < 150);  // the free does not wait for the device
  void* next = h.get(n);
  for (void* p : old) CHECK_OR_DIE(next != p);
  CHECK_OR_DIE(c.snapshot().host_alloc == allocs + 1);
  std::memset(next, 0x11, n);
  CHECK_OR_DIE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK_OR_DIE(all(next, n, 0x11));
  // Once the device is past the frees, the old blocks serve again without the driver: what is
  // cached now is the old blocks and the new segment's.
  h.put(next);
  std::set<void*> again;
  for (int i = 0; i < 2 * count; ++i) again.insert(h.get(n));
  for (void* p : old) CHECK_OR_DIE(again.count(p) == 1);
  CHECK_OR_DIE(c.snapshot().host_alloc == allocs + 1);
  for (void* p : again) h.put(p);
}

int fence(Client& c) {
  Host h(c);
  fenced_reuse(c, h, nullptr, 3 * MiB, 1);   // the legacy stream, a segment each
  fenced_reuse(c, h, nullptr, 4 * KiB, 16);  // a whole 16-block segment
  CUstream s = nullptr;
  CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  fenced_reuse(c, h, s, 5 * MiB, 1);  // a non-blocking stream: not ordered with the legacy one
  return 0;
}

int bad_free(Client& c) {
  Host h(c);
  std::vector<char> plain(4096);
  CHECK_OR_DIE(h.free(plain.data()) == CUDA_ERROR_INVALID_VALUE);  // never pinned
  char* p = static_cast<char*>(h.get(64 * KiB));
  char* q = static_cast<char*>(h.get(64 * KiB));  // the same segment
  std::memset(p, 0x5A, 64 * KiB);
  CHECK_OR_DIE(h.free(p + 8) == CUDA_ERROR_INVALID_VALUE);  // inside a block
  CHECK_OR_DIE(h.free(q + 64 * KiB) == CUDA_ERROR_INVALID_VALUE);  // a block nobody holds
  CHECK_OR_DIE(all(p, 64 * KiB, 0x5A));
  unsigned f = 0;
  CHECK_OR_DIE(h.flags(&f, p) == CUDA_SUCCESS);
  h.put(p);
  CHECK_OR_DIE(h.free(p) == CUDA_ERROR_INVALID_VALUE);  // twice
  CHECK_OR_DIE(h.flags(&f, p) == CUDA_ERROR_INVALID_VALUE);  // freed memory
  h.put(q);
  const fakecuda_stats_t s = c.snapshot();
  CHECK_OR_DIE(s.live_host_allocations == 1);  // the segment, still cached
  return 0;
}

int passthrough(Client& c) {
  Host h(c);
  c.reset_stats();
  for (int i = 0; i < 50; ++i) {
    void* a = h.get(4 * KiB);
    unsigned f = 1;
    CHECK_OR_DIE(h.flags(&f, a) == CUDA_SUCCESS && f == 0);
    h.put(a);
  }
  const fakecuda_stats_t s = c.snapshot();
  CHECK_OR_DIE(s.host_alloc == 50);
  CHECK_OR_DIE(s.host_free == 50);
  CHECK_OR_DIE(s.live_host_allocations == 0);
  return 0;
}

int attributes(Client& c) {
  Host h(c);
  auto native = reinterpret_cast<fakecuda_native_pointer_attribute_fn>(
      dlsym(c.rt.handle, "fakecuda_native_pointer_attribute"));
  auto get_attrs = c.get<AttrsFn>("cuPointerGetAttributes");
  CHECK_OR_DIE(native != nullptr && get_attrs != nullptr);
  void* first = h.get(8 * KiB, CU_MEMHOSTALLOC_DEVICEMAP);
  char* p = static_cast<char*>(h.get(8 * KiB, CU_MEMHOSTALLOC_DEVICEMAP));
  const auto dp = reinterpret_cast<CUdeviceptr>(p);
  // The driver's allocation is the segment: it starts before this block.
  CUdeviceptr seg = 0;
  CHECK_OR_DIE(native(&seg, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dp) == CUDA_SUCCESS && seg < dp);
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned type = 0;
  unsigned long long id_p = 0, id_first = 0;
  CHECK_OR_DIE(c.api.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dp + 100) == CUDA_SUCCESS);
  CHECK_OR_DIE(start == dp);
  CHECK_OR_DIE(c.api.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dp) == CUDA_SUCCESS);
  CHECK_OR_DIE(size == 8 * KiB);
  CHECK_OR_DIE(c.api.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp) == CUDA_SUCCESS);
  CHECK_OR_DIE(type == CU_MEMORYTYPE_HOST);
  CHECK_OR_DIE(c.api.cuPointerGetAttribute(&id_p, CU_POINTER_ATTRIBUTE_BUFFER_ID, dp) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuPointerGetAttribute(&id_first, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                           reinterpret_cast<CUdeviceptr>(first)) == CUDA_SUCCESS);
  CHECK_OR_DIE(id_p != id_first);  // the driver's would be the segment's, the same for both
  CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
  start = 0;
  size = 0;
  type = 0;
  void* data[3] = {&start, &size, &type};
  CHECK_OR_DIE(get_attrs(3, attrs, data, dp + 5) == CUDA_SUCCESS);
  CHECK_OR_DIE(start == dp && size == 8 * KiB && type == CU_MEMORYTYPE_HOST);
  CUdeviceptr base = 0;
  CHECK_OR_DIE(c.api.cuMemGetAddressRange_v2(&base, &size, dp + 7) == CUDA_SUCCESS);
  CHECK_OR_DIE(base == dp && size == 8 * KiB);
  CUdeviceptr mapped = 0;
  CHECK_OR_DIE(h.devptr(&mapped, p + 100, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(mapped == dp + 100);  // the fake maps host memory at its own address
  h.put(p);
  CHECK_OR_DIE(c.api.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dp) ==
               CUDA_ERROR_INVALID_VALUE);
  CHECK_OR_DIE(h.devptr(&mapped, p, 0) == CUDA_ERROR_INVALID_VALUE);
  h.put(first);
  return 0;
}

int limit(Client& c) {
  Host h(c);
  void* a = h.get(5 * MiB);
  h.put(a);
  c.reset_stats();
  void* b = h.get(6 * MiB);  // 5 + 6 > 8: the idle 5 MiB goes back first
  fakecuda_stats_t s = c.snapshot();
  CHECK_OR_DIE(s.host_free == 1 && s.live_host_allocations == 1);
  void* d = nullptr;
  CHECK_OR_DIE(h.alloc(&d, 4 * MiB, 0) == CUDA_ERROR_OUT_OF_MEMORY);
  std::memset(b, 1, 6 * MiB);
  h.put(b);
  void* e = h.get(2 * MiB);  // 6 + 2 fits: the idle 6 MiB may stay
  h.put(e);
  return 0;
}

int trim(Client& c) {
  Host h(c);
  std::vector<void*> v = {h.get(3 * MiB), h.get(7 * MiB), h.get(4 * KiB)};
  for (void* p : v) h.put(p);
  CHECK_OR_DIE(c.snapshot().live_host_allocations == 3);
  CUmemoryPool pool = nullptr;
  auto trim_to = client::default_pool_trim(c, &pool);
  CHECK_OR_DIE(trim_to(pool, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.snapshot().live_host_allocations == 0);
  return 0;
}

int oom(Client& c) {
  Host h(c);
  void* a = h.get(2 * MiB);
  h.put(a);
  c.reset_stats();
  CHECK_OR_DIE(c.fail_next != nullptr);
  c.fail_next("cuMemHostAlloc", 0, CUDA_ERROR_OUT_OF_MEMORY);
  void* b = h.get(7 * MiB);
  const fakecuda_stats_t s = c.snapshot();
  CHECK_OR_DIE(s.host_free == 1);   // the idle segment went first
  CHECK_OR_DIE(s.host_alloc == 2);  // refused, then served
  h.put(b);
  return 0;
}

int ctx_destroy(Client& c) {
  using CtxCreateFn = CUresult (*)(CUcontext*, unsigned, CUdevice);
  using CtxDestroyFn = CUresult (*)(CUcontext);
  auto create = proc<CtxCreateFn>(c, "cuCtxCreate", 3020);
  auto destroy = proc<CtxDestroyFn>(c, "cuCtxDestroy", 4000);
  CUcontext ctx = nullptr;
  CHECK_OR_DIE(create(&ctx, 0, 0) == CUDA_SUCCESS);
  CUdeviceptr d[3] = {};
  for (auto& p : d) CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 1 * MiB) == CUDA_SUCCESS);
  for (auto p : d) CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  Host h(c);
  h.put(h.get(4 * KiB));
  CHECK_OR_DIE(destroy(ctx) == CUDA_SUCCESS);
  // The primary context allocates too: its summary comes at exit.
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  Client& c = client::client();
  const std::string s = argv[1];
  if (s == "pairs") return pairs(c);
  if (s == "flags") return flags(c);
  if (s == "fence") return fence(c);
  if (s == "bad_free") return bad_free(c);
  if (s == "passthrough") return passthrough(c);
  if (s == "attributes") return attributes(c);
  if (s == "limit") return limit(c);
  if (s == "trim") return trim(c);
  if (s == "oom") return oom(c);
  if (s == "ctx_destroy") return ctx_destroy(c);
  return 2;
}
