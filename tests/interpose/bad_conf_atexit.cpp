// A program whose exit handlers make CUDA calls, run with a CUDALLOC_CONF that cudalloc refuses.
// The first call exits (status 1); the handler registered before it and a static destructor
// then call cuMemAlloc and cuMemFree again, on the exiting thread and on a thread the handler
// starts and joins. Each prints the driver's answer. check_process.py bad_config_atexit
// runs it under a timeout: the exit must finish, every late call must answer
// CUDA_ERROR_NOT_INITIALIZED, and the configuration error must be printed once.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cuda.h"

namespace {

using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);
using MemFree = CUresult (*)(CUdeviceptr);
MemAlloc g_alloc = nullptr;
MemFree g_free = nullptr;

void late_calls(const char* who) {
  CUdeviceptr p = 0;
  const CUresult a = g_alloc(&p, 1 << 20);
  const CUresult f = g_free(p);
  std::printf("%s: cuMemAlloc %d cuMemFree %d\n", who, static_cast<int>(a), static_cast<int>(f));
  std::fflush(stdout);
}

struct Global {
  ~Global() { late_calls("static destructor"); }
} g_global;

}  // namespace

int main() {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (cuda == nullptr) return 2;
  // Through the preloaded dlsym: cudalloc's hooks, looked up before any configuration is read.
  g_alloc = reinterpret_cast<MemAlloc>(dlsym(cuda, "cuMemAlloc_v2"));
  g_free = reinterpret_cast<MemFree>(dlsym(cuda, "cuMemFree_v2"));
  if (g_alloc == nullptr || g_free == nullptr) return 2;
  std::atexit([] {
    late_calls("atexit handler");
    std::thread([] { late_calls("thread started during exit"); }).join();
  });
  CUdeviceptr p = 0;
  const CUresult r = g_alloc(&p, 4096);  // the first CUDA call: cudalloc reads its configuration
  std::printf("first call returned %d: not reached with a refused configuration\n", static_cast<int>(r));
  return 0;
}
