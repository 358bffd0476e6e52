// A program linked with -lcuda, as CuPy's and many codes' driver modules are: its calls bind
// to cudalloc's exports through the PLT. Its kernel launches must reach the submission watch
// as the runtime's do: a block freed while a launched kernel still uses it is not handed out
// before the kernel ran, and with no launch the pairs cycle on one block.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <set>
#include <string>

#include "fake_cuda_control.h"

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL %s\n", what);
    ++failures;
  }
}

bool is_cudalloc(const void* p) {
  Dl_info info{};
  return p != nullptr && dladdr(p, &info) != 0 && info.dli_fname != nullptr &&
         std::string(info.dli_fname).find("libcudalloc") != std::string::npos;
}

std::set<CUdeviceptr> pairs(size_t n, int count, CUdeviceptr watched, CUstream busy, int* early) {
  std::set<CUdeviceptr> seen;
  for (int i = 0; i < count; ++i) {
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, n) != CUDA_SUCCESS) check(false, "cuMemAlloc");
    if (early != nullptr && p == watched && cuStreamQuery(busy) == CUDA_ERROR_NOT_READY) ++*early;
    seen.insert(p);
    if (cuMemFree(p) != CUDA_SUCCESS) check(false, "cuMemFree");
  }
  return seen;
}

}  // namespace

int main() {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    std::fprintf(stderr, "FAIL no context\n");
    return 1;
  }
  check(is_cudalloc(reinterpret_cast<void*>(&cuLaunchKernel)), "cuLaunchKernel binds to cudalloc's export");
  check(is_cudalloc(reinterpret_cast<void*>(&cuMemcpyHtoD)), "cuMemcpyHtoD binds to cudalloc's export");
  const size_t n = 64 << 10;
  pairs(n, 300, 0, nullptr, nullptr);
  check(pairs(n, 1000, 0, nullptr, nullptr).size() == 1, "quiet pairs cycle on one block");

  CUstream nb = nullptr;
  check(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "cuStreamCreate");
  CUdeviceptr a = 0;
  check(cuMemAlloc(&a, n) == CUDA_SUCCESS, "cuMemAlloc");
  size_t bytes = n;
  unsigned char value = 0xAA;
  unsigned delay_us = 200000;
  void* params[] = {&a, &bytes, &value, &delay_us};
  check(cuLaunchKernel(reinterpret_cast<CUfunction>(&fakecuda_launch_write), 1, 1, 1, 1, 1, 1, 0, nb, params,
                       nullptr) == CUDA_SUCCESS,
        "cuLaunchKernel");
  check(cuMemFree(a) == CUDA_SUCCESS, "cuMemFree");
  int early = 0;
  pairs(n, 2000, a, nb, &early);
  check(early == 0, "the launched kernel's block is not handed out before the kernel ran");
  check(cuStreamSynchronize(nb) == CUDA_SUCCESS && cuStreamDestroy(nb) == CUDA_SUCCESS, "stream");
  if (failures == 0) std::printf("linked_launch: ok\n");
  return failures == 0 ? 0 : 1;
}
