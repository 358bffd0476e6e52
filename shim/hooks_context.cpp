// Context lifetime: when a context goes (cuCtxDestroy, cudaDeviceReset through
// cuDevicePrimaryCtxReset, the last cuDevicePrimaryCtxRelease), its allocator forgets every
// block without touching the device, and is never used again. Old pointers then go to the
// driver, which rejects them as it does natively.
#include <array>
#include <mutex>

#include "driver/current_context.h"
#include "shim/free_path.h"
#include "shim/hooks.h"
#include "shim/runtime.h"
#include "shim/stats.h"

using namespace cudalloc;
using namespace cudalloc::shim;

namespace {

// The device's primary context if it is active (retain + release leave its count as it was;
// an inactive one is not created).
CUcontext active_primary(CUdevice dev) {
  const DriverApi& d = driver();
  unsigned flags = 0;
  int active = 0;
  if (d.cuDevicePrimaryCtxGetState == nullptr || d.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS ||
      active == 0) {
    return nullptr;
  }
  CUcontext ctx = nullptr;
  if (d.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) return nullptr;
  d.cuDevicePrimaryCtxRelease_v2(dev);
  return ctx;
}

// A primary context's retains, releases and resets, one device at a time: between a release
// that ends the context and cudalloc's drop of its state, another thread's retain would bring
// the same handle back to life, and that state's blocks (memory the driver took back) would
// serve it.
std::mutex& primary_lock(CUdevice dev) {
  static std::array<std::mutex, 64> locks;
  return locks[static_cast<unsigned>(dev) % locks.size()];
}

void drop(ProcessState& ps, CUcontext ctx) {
  // Its own state only (a green context names its primary's, which lives on).
  if (ContextState* s = ps.contexts.find(ctx); s != nullptr && s->ctx == ctx && runtime().config.stats_at_exit) {
    print_context_end_stats(*s);
  }
  // The device's cached virtual memory pairs go back too: the driver may take a context's memory
  // with it, and a pair it took must never be lent again.
  if (ContextState* s = ps.contexts.find(ctx); s != nullptr && s->ctx == ctx) {
    ps.vmm.release_cached(static_cast<int>(s->device));
  }
  run_parked(ps, ps.contexts.drop(ctx));
}

bool is_primary(CUcontext ctx) {
  const DriverApi& d = driver();
  int count = 0;
  if (d.cuDeviceGetCount == nullptr || d.cuDeviceGetCount(&count) != CUDA_SUCCESS) return false;
  for (int dev = 0; dev < count; ++dev) {
    std::lock_guard lock(primary_lock(dev));  // its retain and release must not meet a last release
    if (active_primary(dev) == ctx) return true;
  }
  return false;
}

CUresult ctx_destroy(CUresult (*real)(CUcontext), CUcontext ctx) {
  // The driver refuses cuCtxDestroy of a primary context, which lives on with its blocks.
  if (ProcessState* ps = caching_state(); ps != nullptr && ps->contexts.find(ctx) != nullptr && !is_primary(ctx)) {
    drop(*ps, ctx);
  }
  return real(ctx);
}

CUresult primary_reset(CUresult (*real)(CUdevice), CUdevice dev) {
  std::lock_guard lock(primary_lock(dev));
  if (ProcessState* ps = caching_state()) {
    if (CUcontext ctx = active_primary(dev)) drop(*ps, ctx);
  }
  return real(dev);
}

CUresult primary_release(CUresult (*real)(CUdevice), CUdevice dev) {
  std::lock_guard lock(primary_lock(dev));
  ProcessState* ps = caching_state();
  CUcontext ctx = ps == nullptr ? nullptr : active_primary(dev);
  const CUresult r = real(dev);
  if (ctx != nullptr && r == CUDA_SUCCESS) {
    unsigned flags = 0;
    int active = 1;
    if (driver().cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && active == 0) {
      drop(*ps, ctx);
    }
  }
  return r;
}

}  // namespace

// Every allocation made under a green context is its device's primary context's (the driver
// reports that context as the owner, and the memory outlives the green context), and kernels
// of either may use it: one allocator serves both, and its device fences record in both.
void cudalloc::shim::adopt_green_context(ProcessState& ps, CUcontext green) {
  CUdevice dev = 0;
  {
    CurrentContext current(green);
    if (!current.ok() || driver().cuCtxGetDevice(&dev) != CUDA_SUCCESS) return;
  }
  CUcontext primary = nullptr;
  {
    std::lock_guard lock(primary_lock(dev));
    primary = active_primary(dev);  // active: the green context holds a retain on it
  }
  if (primary == nullptr || primary == green) return;
  ContextState* s = ps.contexts.get(primary);
  if (s == nullptr) return;
  if (ps.contexts.find(green) != s) ps.contexts.alias(green, s);
  s->backend.add_green(green);
}

CUDALLOC_EXPORT CUresult cuCtxFromGreenCtx(CUcontext* ctx, CUgreenCtx green) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  if (d.cuCtxFromGreenCtx == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = d.cuCtxFromGreenCtx(ctx, green);
  if (ps != nullptr && r == CUDA_SUCCESS && ctx != nullptr && *ctx != nullptr) adopt_green_context(*ps, *ctx);
  return r;
}

// Peer access lets the current context's device reach `peer`'s memory. The driver grants it
// for cuMemAlloc memory (plain segments) by itself; expandable segments are virtual memory,
// which it opens only to the devices named to cuMemSetAccess, so the peer's device is granted
// access to the memory of every context of `peer`'s device (as PyTorch's expandable segments
// do). cuCtxDisablePeerAccess is not interposed: a grant stays until the memory is unmapped, so
// only a program that touches the peer's memory after disabling access (which faults natively)
// sees a difference, and revoking would cost a pass over every mapped range.
CUDALLOC_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  if (d.cuCtxEnablePeerAccess == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = d.cuCtxEnablePeerAccess(peer, flags);
  if (ps == nullptr || (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)) return r;
  CUdevice accessor = 0;
  CUdevice owner = 0;
  if (d.cuCtxGetDevice(&accessor) != CUDA_SUCCESS) return r;
  {
    CurrentContext current(peer);
    if (!current.ok() || d.cuCtxGetDevice(&owner) != CUDA_SUCCESS) return r;
  }
  ps->contexts.grant_peer(owner, accessor);
  return r;
}

// The green context's queued work finishes first: once it is gone no fence can record in it,
// and blocks freed later may have been used there.
CUDALLOC_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx green) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  if (d.cuGreenCtxDestroy == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUcontext ctx = nullptr;
  if (ps != nullptr && d.cuCtxFromGreenCtx != nullptr && d.cuCtxFromGreenCtx(&ctx, green) == CUDA_SUCCESS &&
      ctx != nullptr) {
    if (ContextState* s = ps->contexts.find(ctx); s != nullptr && s->ctx != ctx) {
      {
        CurrentContext current(ctx);
        if (current.ok()) d.cuCtxSynchronize();
      }
      s->backend.remove_green(ctx);
      ps->contexts.unalias(ctx);
    }
  }
  return d.cuGreenCtxDestroy(green);
}

CUDALLOC_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return ctx_destroy(driver().cuCtxDestroy, ctx); }
CUDALLOC_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return ctx_destroy(driver().cuCtxDestroy_v2, ctx); }
CUDALLOC_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return primary_reset(driver().cuDevicePrimaryCtxReset, dev);
}
CUDALLOC_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return primary_reset(driver().cuDevicePrimaryCtxReset_v2, dev);
}
// The context's allocator is made here, where the runtime sets the device up, rather than
// inside the program's first cudaMalloc, which would otherwise pay for it.
CUDALLOC_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  std::lock_guard lock(primary_lock(dev));
  const CUresult r = driver().cuDevicePrimaryCtxRetain(ctx, dev);
  if (r == CUDA_SUCCESS && ctx != nullptr && *ctx != nullptr) {
    if (ProcessState* ps = caching_state()) ps->contexts.get(*ctx);
  }
  return r;
}
CUDALLOC_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return primary_release(driver().cuDevicePrimaryCtxRelease, dev);
}
CUDALLOC_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return primary_release(driver().cuDevicePrimaryCtxRelease_v2, dev);
}
