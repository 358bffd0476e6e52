// 16 threads race the very first driver lookup (dlopen, dlsym of cuGetProcAddress_v2, the
// shim's lazy driver table and configuration), then allocate and free at once.
#include <dlfcn.h>

#include <atomic>
#include <thread>
#include <vector>

#include "client.h"

int main() {
  constexpr int kThreads = 16;
  std::atomic<int> ready{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
      auto* gpa = reinterpret_cast<CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*)>(
          dlsym(h, "cuGetProcAddress_v2"));
      void* alloc = nullptr;
      void* free_fn = nullptr;
      void* init = nullptr;
      void* retain = nullptr;
      void* set_current = nullptr;
      CUdriverProcAddressQueryResult st{};
      if (!client::is_cudalloc(reinterpret_cast<void*>(gpa)) || gpa("cuInit", &init, 2000, 0, &st) != CUDA_SUCCESS ||
          gpa("cuMemAlloc", &alloc, 3020, 0, &st) != CUDA_SUCCESS ||
          gpa("cuMemFree", &free_fn, 3020, 0, &st) != CUDA_SUCCESS ||
          gpa("cuDevicePrimaryCtxRetain", &retain, 7000, 0, &st) != CUDA_SUCCESS ||
          gpa("cuCtxSetCurrent", &set_current, 4000, 0, &st) != CUDA_SUCCESS || !client::is_cudalloc(alloc) ||
          !client::is_cudalloc(free_fn)) {
        failures.fetch_add(1);
        return;
      }
      CUcontext ctx = nullptr;
      if (reinterpret_cast<CUresult (*)(unsigned)>(init)(0) != CUDA_SUCCESS ||
          reinterpret_cast<CUresult (*)(CUcontext*, CUdevice)>(retain)(&ctx, 0) != CUDA_SUCCESS ||
          reinterpret_cast<CUresult (*)(CUcontext)>(set_current)(ctx) != CUDA_SUCCESS) {
        failures.fetch_add(1);
        return;
      }
      for (int i = 0; i < 100; ++i) {
        CUdeviceptr p = 0;
        if (reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(alloc)(&p, 4096 + i) != CUDA_SUCCESS || p % 512 ||
            reinterpret_cast<CUresult (*)(CUdeviceptr)>(free_fn)(p) != CUDA_SUCCESS) {
          failures.fetch_add(1);
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failures.load() != 0) {
    std::fprintf(stderr, "%d threads failed\n", failures.load());
    return 1;
  }
  return 0;
}
