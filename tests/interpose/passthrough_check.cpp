// Run with CUDALLOC_NO_CACHING=1 (or a compute-sanitizer environment): every call reaches
// the driver. Without them (argv[1] == "caching") the cache serves the repeats. With
// argv[2] == "device1" (2 fake devices) it also allocates and frees 8 MiB on device 1.
#include <cstring>

#include "client.h"

int main(int argc, char** argv) {
  const bool expect_caching = argc > 1 && std::strcmp(argv[1], "caching") == 0;
  const bool device1 = argc > 2 && std::strcmp(argv[2], "device1") == 0;
  client::Client& c = client::client();
  c.reset_stats();
  for (int i = 0; i < 50; ++i) {
    CUdeviceptr p = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
  if (device1) {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CHECK_OR_DIE(c.api.cuDeviceGet(&dev, 1) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 8 << 20) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);  // freed from device 0's context
  }
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 0) == CUDA_ERROR_INVALID_VALUE);  // the driver's own answer
  const auto s = c.snapshot();
  std::fprintf(stderr, "driver saw %llu allocs, %llu frees\n", (unsigned long long)s.mem_alloc,
               (unsigned long long)s.mem_free);
  if (expect_caching) {
    CHECK_OR_DIE(s.mem_alloc < 10);
    CHECK_OR_DIE(s.mem_free == 0);
  } else {
    CHECK_OR_DIE(s.mem_alloc == (device1 ? 52 : 51));
    CHECK_OR_DIE(s.mem_free == (device1 ? 51 : 50));
  }
  return 0;
}
