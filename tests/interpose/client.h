// A CUDA program as the runtime builds it: it looks the driver up exactly as cudart 13 does
// (through the preloaded cudalloc, when LD_PRELOAD names it) and then calls what it got.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fake_cuda_control.h"
#include "runtime_lookup.h"

namespace client {

struct Client {
  fakecuda::RuntimeLookup rt;
  const fakecuda::DriverApi& api = rt.api;
  CUcontext ctx = nullptr;
  fakecuda_stats_fn stats = nullptr;
  fakecuda_reset_stats_fn reset_stats = nullptr;
  fakecuda_call_count_fn call_count = nullptr;
  fakecuda_fail_next_fn fail_next = nullptr;
  // The fake driver's "kernels" (fake_cuda_control.h), launched through cuLaunchKernel as the
  // runtime got it: through cudalloc's hook when preloaded, which notes the work queued.
  using PFN_launch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void**, void**);
  PFN_launch launch_kernel = nullptr;
  CUfunction write_kernel = nullptr;
  CUfunction fill_check_kernel = nullptr;
  CUfunction sleep_kernel = nullptr;

  CUresult launch_write(CUstream s, CUdeviceptr ptr, size_t bytes, unsigned char value, unsigned delay_us) const {
    void* params[] = {&ptr, &bytes, &value, &delay_us};
    return launch_kernel(write_kernel, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr);
  }
  CUresult launch_fill_check(CUstream s, CUdeviceptr ptr, size_t bytes, unsigned char expected, unsigned delay_us,
                             unsigned long long* mismatches) const {
    void* params[] = {&ptr, &bytes, &expected, &delay_us, &mismatches};
    return launch_kernel(fill_check_kernel, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr);
  }
  CUresult launch_sleep(CUstream s, unsigned delay_us) const {
    void* params[] = {&delay_us};
    return launch_kernel(sleep_kernel, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr);
  }

  // A pointer the runtime got for `name` (flags 0 or 2), null if none.
  template <typename F>
  F get(const char* name, unsigned flags = 0) const {
    const fakecuda::Lookup* l = rt.find(name, flags);
    return l == nullptr ? nullptr : reinterpret_cast<F>(l->pfn);
  }

  fakecuda_stats_t snapshot() const {
    fakecuda_stats_t s{};
    stats(&s);
    return s;
  }
};

[[noreturn]] inline void die(const std::string& why) {
  std::fprintf(stderr, "client: %s\n", why.c_str());
  std::exit(2);
}

// A driver entry point the runtime's lookups did not cover, got through cuGetProcAddress.
template <typename F>
F proc(Client& c, const char* name, int version) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  if (c.api.cuGetProcAddress_v2(name, &p, version, 0, &st) != CUDA_SUCCESS || p == nullptr)
    die(std::string("proc ") + name);
  return reinterpret_cast<F>(p);
}

// Looks the driver up and makes device 0's primary context current.
inline Client& client() {
  static Client* c = [] {
    auto* c = new Client;
    if (!fakecuda::replay_runtime_lookups(fakecuda::default_tsv_path(), &c->rt)) die(c->rt.error);
    if (c->api.cuInit(0) != CUDA_SUCCESS) die("cuInit");
    CUdevice dev = 0;
    if (c->api.cuDeviceGet(&dev, 0) != CUDA_SUCCESS) die("cuDeviceGet");
    if (c->api.cuDevicePrimaryCtxRetain(&c->ctx, dev) != CUDA_SUCCESS) die("retain");
    if (c->api.cuCtxSetCurrent(c->ctx) != CUDA_SUCCESS) die("set current");
    c->stats = reinterpret_cast<fakecuda_stats_fn>(dlsym(c->rt.handle, "fakecuda_stats"));
    c->reset_stats = reinterpret_cast<fakecuda_reset_stats_fn>(dlsym(c->rt.handle, "fakecuda_reset_stats"));
    c->call_count = reinterpret_cast<fakecuda_call_count_fn>(dlsym(c->rt.handle, "fakecuda_call_count"));
    c->fail_next = reinterpret_cast<fakecuda_fail_next_fn>(dlsym(c->rt.handle, "fakecuda_fail_next"));
    c->launch_kernel = c->get<Client::PFN_launch>("cuLaunchKernel");
    c->write_kernel = reinterpret_cast<CUfunction>(dlsym(c->rt.handle, "fakecuda_launch_write"));
    c->fill_check_kernel = reinterpret_cast<CUfunction>(dlsym(c->rt.handle, "fakecuda_launch_fill_check"));
    c->sleep_kernel = reinterpret_cast<CUfunction>(dlsym(c->rt.handle, "fakecuda_launch_sleep"));
    if (!c->stats || !c->reset_stats || !c->call_count || !c->launch_kernel || !c->write_kernel ||
        !c->fill_check_kernel || !c->sleep_kernel)
      die("controls");
    return c;
  }();
  return *c;
}

// cudaMemPoolTrimTo(pool, keep) as the runtime reaches it; `pool` gets device 0's default pool.
using PFN_trim = CUresult (*)(CUmemoryPool, size_t);
inline PFN_trim default_pool_trim(Client& c, CUmemoryPool* pool) {
  using PFN_default_pool = CUresult (*)(CUmemoryPool*, CUdevice);
  auto default_pool = c.get<PFN_default_pool>("cuDeviceGetDefaultMemPool");
  if (default_pool == nullptr || default_pool(pool, 0) != CUDA_SUCCESS) die("no default memory pool");
  return c.get<PFN_trim>("cuMemPoolTrimTo");
}

// Whether `p` is code of libcudalloc.so (a hook) rather than of the driver.
inline bool is_cudalloc(const void* p) {
  Dl_info info{};
  return p != nullptr && dladdr(p, &info) != 0 && info.dli_fname != nullptr &&
         std::string(info.dli_fname).find("libcudalloc") != std::string::npos;
}

// A CUipcMemHandle as 128 hex digits, for a command line.
inline std::string to_hex(const CUipcMemHandle& h) {
  std::string hex;
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned char>(h.reserved[i]));
    hex += b;
  }
  return hex;
}

#define CHECK_OR_DIE(cond)                                                        \
  do {                                                                            \
    if (!(cond)) ::client::die(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #cond); \
  } while (0)

}  // namespace client
