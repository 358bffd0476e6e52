// The driver functions cudalloc exports and hands out in place of the driver's own.
// Each has exactly the type of the driver function of the same name (driver_api.h).
#pragma once

#include <type_traits>

#include "driver/driver_api.h"

// X(export name)
#define CUDALLOC_HOOKS(X)             \
  X(cuGetProcAddress)                 \
  X(cuGetProcAddress_v2)              \
  X(cuMemAlloc_v2)                    \
  X(cuMemFree_v2)                     \
  X(cuMemAllocAsync)                  \
  X(cuMemAllocAsync_ptsz)             \
  X(cuMemFreeAsync)                   \
  X(cuMemFreeAsync_ptsz)              \
  X(cuMemAllocPitch_v2)               \
  X(cuMemGetInfo_v2)                  \
  X(cuMemGetAddressRange_v2)          \
  X(cuPointerGetAttribute)            \
  X(cuPointerGetAttributes)           \
  X(cuIpcGetMemHandle)                \
  X(cuIpcOpenMemHandle)               \
  X(cuIpcOpenMemHandle_v2)            \
  X(cuIpcCloseMemHandle)              \
  X(cuMemPoolTrimTo)                  \
  X(cuStreamCreate)                   \
  X(cuStreamCreateWithPriority)       \
  X(cuGreenCtxStreamCreate)           \
  X(cuCtxFromGreenCtx)                \
  X(cuCtxEnablePeerAccess)            \
  X(cuGreenCtxDestroy)                \
  X(cuStreamDestroy)                  \
  X(cuStreamDestroy_v2)               \
  X(cuStreamBeginCapture)             \
  X(cuStreamBeginCapture_ptsz)        \
  X(cuStreamBeginCapture_v2)          \
  X(cuStreamBeginCapture_v2_ptsz)     \
  X(cuStreamBeginCaptureToGraph)      \
  X(cuStreamBeginCaptureToGraph_ptsz) \
  X(cuStreamEndCapture)               \
  X(cuStreamEndCapture_ptsz)          \
  X(cuCtxDestroy)                     \
  X(cuCtxDestroy_v2)                  \
  X(cuDevicePrimaryCtxReset)          \
  X(cuDevicePrimaryCtxReset_v2)       \
  X(cuDevicePrimaryCtxRetain)         \
  X(cuDevicePrimaryCtxRelease)        \
  X(cuDevicePrimaryCtxRelease_v2)      \
  X(cuMemHostAlloc)                   \
  X(cuMemAllocHost_v2)                \
  X(cuMemFreeHost)                    \
  X(cuMemHostGetDevicePointer_v2)     \
  X(cuMemHostGetFlags)                \
  X(cuMemAddressReserve)              \
  X(cuMemAddressFree)                 \
  X(cuMemCreate)                      \
  X(cuMemRelease)                     \
  X(cuMemMap)                         \
  X(cuMemUnmap)                       \
  X(cuMemSetAccess)                   \
  X(cuMemRetainAllocationHandle)      \
  X(cuMemExportToShareableHandle)

#define CUDALLOC_DECLARE_HOOK(name) \
  CUDALLOC_EXPORT std::remove_pointer_t<decltype(cudalloc::shim::DriverApi::name)> name;
CUDALLOC_HOOKS(CUDALLOC_DECLARE_HOOK)
#undef CUDALLOC_DECLARE_HOOK

namespace cudalloc::shim {

// Our hook for a pointer the driver handed out, or `real` itself when we do not wrap it.
void* substitute(void* real);
// True for the export names we wrap, and for every name of a call that queues device work
// (cheap; most names fail on the first characters).
bool is_hooked_name(const char* symbol);
// substitute() for a dlsym of `symbol` on a handle, but `real` itself while libcuda is not
// loaded (a lookup in some other library must not load the driver); also tells the
// submission watch of a work-queueing entry point handed out unhooked.
void* answer_lookup_if_loaded(const char* symbol, void* real);
// A dlsym of a driver name through RTLD_DEFAULT or RTLD_NEXT (`next`), which may find the
// driver's own entry point: makes the watch blind if that is one that queues work.
void watch_global_lookup(const char* symbol, bool next);

struct ProcessState;
// A green context met (cuCtxFromGreenCtx, cuGreenCtxStreamCreate): from now on it names its
// device's primary context's state, whose fences cover it (hooks_context.cpp).
void adopt_green_context(ProcessState& ps, CUcontext green);

}  // namespace cudalloc::shim
