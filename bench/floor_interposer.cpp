// The least a preloaded allocator can cost: a library that takes the driver lookups the way
// libcudalloc does (dlsym, cuGetProcAddress) and serves bench_pairs' allocate-free loop from
// one block per thread kept from the previous pair. No stream order, no statistics, no device
// lock, no second block. bench_pairs under it measures the CUDA runtime's layer and the call
// path on their own, so a cudalloc pair can be read against what any interposer pays on the
// same host (scripts/bench, "floor").
//
// A benchmark tool, not an allocator: a block it keeps is never given back, and it is unsafe
// for any program whose device work outlives a free.
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "support/real_dlsym.h"

#define FLOOR_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using cudalloc::shim::DlsymFn;
using cudalloc::shim::real_dlsym;  // the C library's dlsym, found as libcudalloc finds it

using AllocFn = CUresult (*)(CUdeviceptr*, size_t);
using FreeFn = CUresult (*)(CUdeviceptr);
using AllocAsyncFn = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using FreeAsyncFn = CUresult (*)(CUdeviceptr, CUstream);
using ProcV1Fn = CUresult (*)(const char*, void**, int, cuuint64_t);
using ProcV2Fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

struct Driver {
  AllocFn alloc;
  FreeFn free;
  AllocAsyncFn alloc_async, alloc_async_ptsz;
  FreeAsyncFn free_async, free_async_ptsz;
  ProcV1Fn proc_v1;
  ProcV2Fn proc_v2;
};
Driver g_real{};
std::atomic<bool> g_loaded{false};
std::mutex g_load_lock;

// The driver's own entry points, once libcuda is in the process (the runtime dlopens it before
// its first lookup).
bool load_driver() {
  if (g_loaded.load(std::memory_order_acquire)) return true;
  std::lock_guard lock(g_load_lock);
  if (g_loaded.load(std::memory_order_relaxed)) return true;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  const DlsymFn sym = real_dlsym();
  auto get = [&](auto& out, const char* name) { out = reinterpret_cast<std::remove_reference_t<decltype(out)>>(sym(h, name)); };
  get(g_real.alloc, "cuMemAlloc_v2");
  get(g_real.free, "cuMemFree_v2");
  get(g_real.alloc_async, "cuMemAllocAsync");
  get(g_real.alloc_async_ptsz, "cuMemAllocAsync_ptsz");
  get(g_real.free_async, "cuMemFreeAsync");
  get(g_real.free_async_ptsz, "cuMemFreeAsync_ptsz");
  get(g_real.proc_v1, "cuGetProcAddress");
  get(g_real.proc_v2, "cuGetProcAddress_v2");
  g_loaded.store(true, std::memory_order_release);
  return true;
}

// One block per thread: the one last handed out, kept when it comes back.
struct Slot {
  CUdeviceptr handed = 0;
  size_t handed_bytes = 0;
  CUdeviceptr kept = 0;
  size_t kept_bytes = 0;
};
thread_local Slot t_slot;

template <typename Miss>
CUresult take(CUdeviceptr* p, size_t bytes, Miss&& miss) {
  Slot& s = t_slot;
  if (s.kept != 0 && s.kept_bytes == bytes) {
    *p = s.kept;
    s.kept = 0;
  } else if (const CUresult r = miss(); r != CUDA_SUCCESS) {
    return r;
  }
  s.handed = *p;
  s.handed_bytes = bytes;
  return CUDA_SUCCESS;
}

// Keeps `p` if it is the block last handed out; the block kept before it, if any, goes back to
// the driver through `release`.
template <typename Release>
CUresult give(CUdeviceptr p, Release&& release) {
  Slot& s = t_slot;
  if (p == 0 || p != s.handed) return release(p);
  const CUdeviceptr old = s.kept;
  s.kept = p;
  s.kept_bytes = s.handed_bytes;
  s.handed = 0;
  return old != 0 ? release(old) : CUDA_SUCCESS;
}

CUresult floor_alloc(CUdeviceptr* p, size_t bytes) {
  return take(p, bytes, [&] { return g_real.alloc(p, bytes); });
}
CUresult floor_free(CUdeviceptr p) {
  return give(p, [](CUdeviceptr q) { return g_real.free(q); });
}
CUresult floor_alloc_async(CUdeviceptr* p, size_t bytes, CUstream s) {
  return take(p, bytes, [&] { return g_real.alloc_async(p, bytes, s); });
}
CUresult floor_alloc_async_ptsz(CUdeviceptr* p, size_t bytes, CUstream s) {
  return take(p, bytes, [&] { return g_real.alloc_async_ptsz(p, bytes, s); });
}
CUresult floor_free_async(CUdeviceptr p, CUstream s) {
  return give(p, [s](CUdeviceptr q) { return g_real.free_async(q, s); });
}
CUresult floor_free_async_ptsz(CUdeviceptr p, CUstream s) {
  return give(p, [s](CUdeviceptr q) { return g_real.free_async_ptsz(q, s); });
}

void* substitute(void* p);

CUresult floor_proc_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  const CUresult r = g_real.proc_v1(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr) *pfn = substitute(*pfn);
  return r;
}
CUresult floor_proc_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult* status) {
  const CUresult r = g_real.proc_v2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn != nullptr) *pfn = substitute(*pfn);
  return r;
}

// By the identity of the driver's answer, as libcudalloc chooses its wrappers.
void* substitute(void* p) {
  if (p == nullptr || !load_driver()) return p;
  const Driver& d = g_real;
  if (p == reinterpret_cast<void*>(d.alloc)) return reinterpret_cast<void*>(&floor_alloc);
  if (p == reinterpret_cast<void*>(d.free)) return reinterpret_cast<void*>(&floor_free);
  if (p == reinterpret_cast<void*>(d.alloc_async)) return reinterpret_cast<void*>(&floor_alloc_async);
  if (p == reinterpret_cast<void*>(d.alloc_async_ptsz)) return reinterpret_cast<void*>(&floor_alloc_async_ptsz);
  if (p == reinterpret_cast<void*>(d.free_async)) return reinterpret_cast<void*>(&floor_free_async);
  if (p == reinterpret_cast<void*>(d.free_async_ptsz)) return reinterpret_cast<void*>(&floor_free_async_ptsz);
  if (p == reinterpret_cast<void*>(d.proc_v1)) return reinterpret_cast<void*>(&floor_proc_v1);
  if (p == reinterpret_cast<void*>(d.proc_v2)) return reinterpret_cast<void*>(&floor_proc_v2);
  return p;
}

}  // namespace

// RTLD_NEXT and RTLD_DEFAULT lookups are forwarded as a tail call (glibc resolves "next"
// relative to its caller); driver names from other handles get the substitutes.
FLOOR_EXPORT void* dlsym(void* handle, const char* symbol) {
  const DlsymFn real = real_dlsym();
  if (handle == RTLD_NEXT || handle == RTLD_DEFAULT || std::strncmp(symbol, "cu", 2) != 0) {
    return real(handle, symbol);
  }
  return substitute(real(handle, symbol));
}
