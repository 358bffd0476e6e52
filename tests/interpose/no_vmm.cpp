// expandable_segments:true on a device without virtual memory management. Run with 2 fake
// devices, FAKE_CUDA_NO_VMM=1 (device 1 has none: cuMemCreate is refused there with
// CUDA_ERROR_NOT_SUPPORTED, as a real driver refuses it) and CUDALLOC_CONF=expandable_segments:true,
// through check_process.py no_vmm, which also checks the warning, the trace and the statistics.
// Device 0 keeps expandable segments; device 1's allocations, in its primary context and in a
// second context, are served from plain segments (cuMemAlloc), and what is written stays intact.
// Before the fallback every allocation on device 1 failed with the driver's error.
#include <vector>

#include "client.h"

using client::Client;
using client::proc;

namespace {

constexpr std::size_t MiB = 1 << 20;
using CtxCreateFn = CUresult (*)(CUcontext*, unsigned, CUdevice);
using CtxPopFn = CUresult (*)(CUcontext*);

struct Written {
  CUdeviceptr ptr;
  std::size_t bytes;
  unsigned seed;
};

unsigned char pattern(unsigned seed, std::size_t k) { return static_cast<unsigned char>(seed * 31 + k * 7 + (k >> 12)); }

// Allocates `bytes` in the current context and writes a pattern of its own to all of it.
Written allocate_and_write(Client& c, std::size_t bytes, unsigned seed) {
  Written w{0, bytes, seed};
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&w.ptr, bytes) == CUDA_SUCCESS);
  std::vector<unsigned char> h(bytes);
  for (std::size_t k = 0; k < bytes; ++k) h[k] = pattern(seed, k);
  CHECK_OR_DIE(c.api.cuMemcpyHtoD_v2(w.ptr, h.data(), bytes) == CUDA_SUCCESS);
  return w;
}

bool intact(Client& c, const Written& w) {
  std::vector<unsigned char> h(w.bytes);
  if (c.api.cuMemcpyDtoH_v2(h.data(), w.ptr, w.bytes) != CUDA_SUCCESS) return false;
  for (std::size_t k = 0; k < w.bytes; ++k) {
    if (h[k] != pattern(w.seed, k)) return false;
  }
  return true;
}

}  // namespace

int main() {
  Client& c = client::client();
  auto create = proc<CtxCreateFn>(c, "cuCtxCreate", 3020);
  auto pop = proc<CtxPopFn>(c, "cuCtxPopCurrent", 4000);

  // Device 0 has virtual memory: an expandable segment, no cuMemAlloc.
  c.reset_stats();
  const Written on0 = allocate_and_write(c, 8 * MiB, 1);
  auto s = c.snapshot();
  std::fprintf(stderr, "device 0: %llu cuMemAlloc, %llu cuMemCreate\n", (unsigned long long)s.mem_alloc,
               (unsigned long long)s.vm_create);
  CHECK_OR_DIE(s.mem_alloc == 0 && s.vm_create >= 1);

  // Device 1 has none: plain segments, one cuMemAlloc each (2 MiB of the small pool, a 20 MiB
  // segment for 6 MiB, 30 MiB for 30 MiB), no virtual memory call.
  CUdevice dev1 = 0;
  CUcontext primary1 = nullptr;
  CHECK_OR_DIE(c.api.cuDeviceGet(&dev1, 1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&primary1, dev1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(primary1) == CUDA_SUCCESS);
  c.reset_stats();
  std::vector<Written> on1;
  on1.push_back(allocate_and_write(c, 4096, 2));
  on1.push_back(allocate_and_write(c, 6 * MiB, 3));
  on1.push_back(allocate_and_write(c, 30 * MiB, 4));
  on1.push_back(allocate_and_write(c, 5000, 5));  // from the small segment: no device call
  s = c.snapshot();
  std::fprintf(stderr, "device 1: %llu cuMemAlloc, %llu cuMemCreate, %llu cuMemAddressReserve\n",
               (unsigned long long)s.mem_alloc, (unsigned long long)s.vm_create, (unsigned long long)s.vm_reserve);
  CHECK_OR_DIE(s.mem_alloc == 3);
  CHECK_OR_DIE(s.vm_create == 0 && s.vm_reserve == 0);

  // A second context of device 1: plain segments too (and no second warning).
  CUcontext other = nullptr;
  CHECK_OR_DIE(create(&other, 0, dev1) == CUDA_SUCCESS);  // pushed
  const Written in_other = allocate_and_write(c, 1 * MiB, 6);
  CHECK_OR_DIE(intact(c, in_other));
  CHECK_OR_DIE(c.api.cuMemFree_v2(in_other.ptr) == CUDA_SUCCESS);
  CUcontext popped = nullptr;
  CHECK_OR_DIE(pop(&popped) == CUDA_SUCCESS);  // device 1's primary context again
  s = c.snapshot();
  CHECK_OR_DIE(s.mem_alloc == 4);
  CHECK_OR_DIE(s.vm_create == 0 && s.vm_reserve == 0);

  for (const Written& w : on1) CHECK_OR_DIE(intact(c, w));
  for (const Written& w : on1) CHECK_OR_DIE(c.api.cuMemFree_v2(w.ptr) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CHECK_OR_DIE(intact(c, on0));
  CHECK_OR_DIE(c.api.cuMemFree_v2(on0.ptr) == CUDA_SUCCESS);
  std::fprintf(stderr, "no_vmm: ok\n");
  return 0;
}
