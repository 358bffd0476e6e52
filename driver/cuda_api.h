// cuda.h for the driver model and the shim: the driver API types and declarations, without the
// macros that rename a base name to its newest version (cuStreamDestroy -> cuStreamDestroy_v2 ...).
// The hooks name every export exactly, so those macros would only get in the way.
#pragma once

#include <cuda.h>

#undef cuGetProcAddress
#undef cuStreamDestroy
#undef cuCtxDestroy
#undef cuStreamBeginCapture
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemAllocPitch
#undef cuMemGetInfo
#undef cuMemGetAddressRange
#undef cuEventDestroy
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuDeviceTotalMem
#undef cuIpcOpenMemHandle

// The exported hooks: visible outside the library (shim/exports.map lists them too).
#define CUDALLOC_EXPORT extern "C" __attribute__((visibility("default")))
