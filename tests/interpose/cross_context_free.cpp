// A block of context A freed in the order of a stream of context B (device 1), whose work
// still uses it: context A must not hand it out again before that work is done. A's device
// fence covers A's streams only; the free's fence is an event on B's stream.
#include <vector>

#include "client.h"

int main() {
  client::Client& c = client::client();
  const std::size_t n = 24 << 20;
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);  // context A, device 0
  CUdevice dev1 = 0;
  CUcontext ctx1 = nullptr;
  CHECK_OR_DIE(c.api.cuDeviceGet(&dev1, 1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&ctx1, dev1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  CUstream sb = nullptr;
  CHECK_OR_DIE(c.api.cuStreamCreate(&sb, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(sb, p, n, 0xAA, 300000) == CUDA_SUCCESS);  // B uses p for 300 ms
  CHECK_OR_DIE(c.api.cuMemFreeAsync(p, sb) == CUDA_SUCCESS);
  CUevent b_done = nullptr;
  CHECK_OR_DIE(c.api.cuEventCreate(&b_done, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuEventRecord(b_done, sb) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CUdeviceptr q = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&q, n) == CUDA_SUCCESS);
  const bool b_running = c.api.cuEventQuery(b_done) == CUDA_ERROR_NOT_READY;
  CHECK_OR_DIE(c.launch_write(nullptr, q, n, 0x55, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  std::vector<unsigned char> host(n);
  CHECK_OR_DIE(c.api.cuMemcpyDtoH_v2(host.data(), q, n) == CUDA_SUCCESS);
  std::size_t bad = 0;
  for (unsigned char x : host) bad += x != 0x55;
  std::fprintf(stderr, "cross_context_free: reused %d while B ran %d; %zu of %zu bytes overwritten\n", q == p,
               b_running, bad, n);
  if (q == p && b_running) return 1;  // handed out while B's work still used it
  // Once B's work is done the block is reusable again: the fence completes.
  CHECK_OR_DIE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
  return bad == 0 ? 0 : 1;
}
