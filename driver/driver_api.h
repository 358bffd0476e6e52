// The real driver entry points the shim calls for itself. Resolved with the C library's
// dlsym on the libcuda handle, so they are never our own hooks, and never the runtime.
#pragma once

#include <atomic>
#include <type_traits>

#include "driver/cuda_api.h"

namespace cudalloc::shim {

// X(export name, function type). Every name the shim calls or wraps.
#define CUDALLOC_DRIVER_FUNCTIONS(X)                                                           \
  X(cuGetProcAddress, CUresult(const char*, void**, int, cuuint64_t))                          \
  X(cuGetProcAddress_v2,                                                                       \
    CUresult(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*))           \
  X(cuCtxGetCurrent, CUresult(CUcontext*))                                                     \
  X(cuCtxGetDevice, CUresult(CUdevice*))                                                       \
  X(cuCtxPushCurrent_v2, CUresult(CUcontext))                                                  \
  X(cuCtxPopCurrent_v2, CUresult(CUcontext*))                                                  \
  X(cuCtxSynchronize, CUresult())                                                              \
  X(cuCtxEnablePeerAccess, CUresult(CUcontext, unsigned int))                                  \
  X(cuStreamSynchronize, CUresult(CUstream))                                                    \
  X(cuStreamQuery, CUresult(CUstream))                                                          \
  X(cuCtxDestroy, CUresult(CUcontext))                                                         \
  X(cuCtxDestroy_v2, CUresult(CUcontext))                                                      \
  X(cuDevicePrimaryCtxRetain, CUresult(CUcontext*, CUdevice))                                  \
  X(cuDeviceGetCount, CUresult(int*))                                                           \
  X(cuDevicePrimaryCtxGetState, CUresult(CUdevice, unsigned int*, int*))                       \
  X(cuDevicePrimaryCtxReset, CUresult(CUdevice))                                               \
  X(cuDevicePrimaryCtxReset_v2, CUresult(CUdevice))                                            \
  X(cuDevicePrimaryCtxRelease, CUresult(CUdevice))                                             \
  X(cuDevicePrimaryCtxRelease_v2, CUresult(CUdevice))                                          \
  X(cuDeviceTotalMem_v2, CUresult(size_t*, CUdevice))                                          \
  X(cuDeviceGetAttribute, CUresult(int*, CUdevice_attribute, CUdevice))                        \
  X(cuMemAlloc_v2, CUresult(CUdeviceptr*, size_t))                                             \
  X(cuMemFree_v2, CUresult(CUdeviceptr))                                                       \
  X(cuMemAllocAsync, CUresult(CUdeviceptr*, size_t, CUstream))                                 \
  X(cuMemAllocAsync_ptsz, CUresult(CUdeviceptr*, size_t, CUstream))                            \
  X(cuMemFreeAsync, CUresult(CUdeviceptr, CUstream))                                           \
  X(cuMemFreeAsync_ptsz, CUresult(CUdeviceptr, CUstream))                                      \
  X(cuMemAllocPitch_v2, CUresult(CUdeviceptr*, size_t*, size_t, size_t, unsigned int))         \
  X(cuMemGetInfo_v2, CUresult(size_t*, size_t*))                                               \
  X(cuMemGetAddressRange_v2, CUresult(CUdeviceptr*, size_t*, CUdeviceptr))                     \
  X(cuPointerGetAttribute, CUresult(void*, CUpointer_attribute, CUdeviceptr))                  \
  X(cuPointerGetAttributes, CUresult(unsigned int, CUpointer_attribute*, void**, CUdeviceptr)) \
  X(cuIpcGetMemHandle, CUresult(CUipcMemHandle*, CUdeviceptr))                                 \
  X(cuIpcOpenMemHandle, CUresult(CUdeviceptr*, CUipcMemHandle, unsigned int))                  \
  X(cuIpcOpenMemHandle_v2, CUresult(CUdeviceptr*, CUipcMemHandle, unsigned int))               \
  X(cuIpcCloseMemHandle, CUresult(CUdeviceptr))                                                \
  X(cuEventCreate, CUresult(CUevent*, unsigned int))                                           \
  X(cuEventDestroy_v2, CUresult(CUevent))                                                      \
  X(cuEventRecord, CUresult(CUevent, CUstream))                                                \
  X(cuCtxRecordEvent, CUresult(CUcontext, CUevent))                                            \
  X(cuEventQuery, CUresult(CUevent))                                                           \
  X(cuEventSynchronize, CUresult(CUevent))                                                     \
  X(cuStreamWaitEvent, CUresult(CUstream, CUevent, unsigned int))                              \
  X(cuStreamCreate, CUresult(CUstream*, unsigned int))                                         \
  X(cuStreamCreateWithPriority, CUresult(CUstream*, unsigned int, int))                        \
  X(cuGreenCtxStreamCreate, CUresult(CUstream*, CUgreenCtx, unsigned int, int))                \
  X(cuCtxFromGreenCtx, CUresult(CUcontext*, CUgreenCtx))                                       \
  X(cuGreenCtxDestroy, CUresult(CUgreenCtx))                                                   \
  X(cuStreamDestroy, CUresult(CUstream))                                                       \
  X(cuStreamDestroy_v2, CUresult(CUstream))                                                    \
  X(cuStreamGetFlags, CUresult(CUstream, unsigned int*))                                       \
  X(cuStreamGetCtx, CUresult(CUstream, CUcontext*))                                            \
  X(cuStreamIsCapturing, CUresult(CUstream, CUstreamCaptureStatus*))                           \
  X(cuThreadExchangeStreamCaptureMode, CUresult(CUstreamCaptureMode*))                          \
  X(cuStreamIsCapturing_ptsz, CUresult(CUstream, CUstreamCaptureStatus*))                      \
  X(cuStreamBeginCapture, CUresult(CUstream))                                                  \
  X(cuStreamBeginCapture_ptsz, CUresult(CUstream))                                             \
  X(cuStreamBeginCapture_v2, CUresult(CUstream, CUstreamCaptureMode))                          \
  X(cuStreamBeginCapture_v2_ptsz, CUresult(CUstream, CUstreamCaptureMode))                     \
  X(cuStreamBeginCaptureToGraph, CUresult(CUstream, CUgraph, const CUgraphNode*,               \
                                          const CUgraphEdgeData*, size_t, CUstreamCaptureMode)) \
  X(cuStreamBeginCaptureToGraph_ptsz,                                                          \
    CUresult(CUstream, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t,            \
             CUstreamCaptureMode))                                                             \
  X(cuStreamEndCapture, CUresult(CUstream, CUgraph*))                                          \
  X(cuStreamEndCapture_ptsz, CUresult(CUstream, CUgraph*))                                     \
  X(cuMemAddressReserve, CUresult(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)) \
  X(cuMemAddressFree, CUresult(CUdeviceptr, size_t))                                           \
  X(cuMemCreate, CUresult(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,   \
                          unsigned long long))                                                 \
  X(cuMemRelease, CUresult(CUmemGenericAllocationHandle))                                      \
  X(cuMemMap, CUresult(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,              \
                       unsigned long long))                                                    \
  X(cuMemUnmap, CUresult(CUdeviceptr, size_t))                                                 \
  X(cuMemSetAccess, CUresult(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t))            \
  X(cuMemExportToShareableHandle,                                                              \
    CUresult(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long)) \
  X(cuMemImportFromShareableHandle,                                                            \
    CUresult(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType))                 \
  X(cuMemRetainAllocationHandle, CUresult(CUmemGenericAllocationHandle*, void*))              \
  X(cuMemGetAllocationGranularity,                                                             \
    CUresult(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags))           \
  X(cuMemPoolTrimTo, CUresult(CUmemoryPool, size_t))                                           \
  X(cuDeviceGetDefaultMemPool, CUresult(CUmemoryPool*, CUdevice))                              \
  X(cuDeviceGetMemPool, CUresult(CUmemoryPool*, CUdevice))                                    \
  X(cuMemHostAlloc, CUresult(void**, size_t, unsigned int))                                    \
  X(cuMemAllocHost_v2, CUresult(void**, size_t))                                               \
  X(cuMemFreeHost, CUresult(void*))                                                            \
  X(cuMemHostGetDevicePointer_v2, CUresult(CUdeviceptr*, void*, unsigned int))                 \
  X(cuMemHostGetFlags, CUresult(unsigned int*, void*))

struct DriverApi {
#define CUDALLOC_FIELD(name, type) std::add_pointer_t<type> name = nullptr;
  CUDALLOC_DRIVER_FUNCTIONS(CUDALLOC_FIELD)
#undef CUDALLOC_FIELD
};

// The table, if libcuda.so.1 is already loaded in the process; null otherwise. Never loads
// the driver (the dlsym override uses this: a lookup in some other library must not load it).
const DriverApi* driver_if_loaded();

// From now on every hook's call to the driver answers CUDA_ERROR_NOT_INITIALIZED (the
// configuration was refused and the process is exiting; see runtime.cpp).
void refuse_driver_calls();

namespace detail {
extern std::atomic<const DriverApi*> g_api;  // set once the table is resolved
const DriverApi& driver_slow();
}  // namespace detail

// The table for the hooks: they only run in a process that uses CUDA, so this loads the
// driver if it somehow is not loaded yet. Entries the driver lacks stay null. Inline up to the
// loaded table: every hook asks for it.
inline const DriverApi& driver() {
  if (const DriverApi* api = detail::g_api.load(std::memory_order_acquire)) [[likely]] return *api;
  return detail::driver_slow();
}

}  // namespace cudalloc::shim
