// A client that reaches the driver exactly the way a (static or shared) CUDA 13 runtime
// does: dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL), one dlsym(handle,
// "cuGetProcAddress_v2"), then the 440 cuGetProcAddress_v2 lookups of
// cudart13-driver-lookups.tsv in order, switching to the pointer returned for
// "cuGetProcAddress" (version 12000) as soon as it has it.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>
#include <vector>

namespace fakecuda {

struct Lookup {
    std::string name;       // requested base name ("" for the probe)
    int version = 0;
    unsigned flags = 0;     // 0 legacy, 2 per-thread default stream
    int expected = 0;       // result column of the TSV
    int result = -1;        // CUresult this replay got
    int status = -1;        // CUdriverProcAddressQueryResult
    void* pfn = nullptr;
    std::string resolved;   // exported name the pointer belongs to (dladdr), "" if none
};

// Pointers the runtime ends up with, named by the driver export they must be.
// Filled from the replayed lookups (the last lookup of a name with the matching flags wins).
struct DriverApi {
    PFN_cuInit_v2000 cuInit = nullptr;
    PFN_cuGetProcAddress_v12000 cuGetProcAddress_v2 = nullptr;
    PFN_cuDriverGetVersion_v2020 cuDriverGetVersion = nullptr;
    PFN_cuDeviceGet_v2000 cuDeviceGet = nullptr;
    PFN_cuDeviceGetCount_v2000 cuDeviceGetCount = nullptr;
    PFN_cuDevicePrimaryCtxRetain_v7000 cuDevicePrimaryCtxRetain = nullptr;
    PFN_cuDevicePrimaryCtxRelease_v11000 cuDevicePrimaryCtxRelease_v2 = nullptr;
    PFN_cuDevicePrimaryCtxReset_v11000 cuDevicePrimaryCtxReset_v2 = nullptr;
    PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent = nullptr;
    PFN_cuCtxGetCurrent_v4000 cuCtxGetCurrent = nullptr;
    PFN_cuCtxSynchronize_v2000 cuCtxSynchronize = nullptr;
    PFN_cuMemAlloc_v3020 cuMemAlloc_v2 = nullptr;
    PFN_cuMemFree_v3020 cuMemFree_v2 = nullptr;
    PFN_cuMemAllocAsync_v11020 cuMemAllocAsync = nullptr;
    PFN_cuMemAllocAsync_v11020_ptsz cuMemAllocAsync_ptsz = nullptr;
    PFN_cuMemFreeAsync_v11020 cuMemFreeAsync = nullptr;
    PFN_cuMemFreeAsync_v11020_ptsz cuMemFreeAsync_ptsz = nullptr;
    PFN_cuMemGetInfo_v3020 cuMemGetInfo_v2 = nullptr;
    PFN_cuMemGetAddressRange_v3020 cuMemGetAddressRange_v2 = nullptr;
    PFN_cuPointerGetAttribute_v4000 cuPointerGetAttribute = nullptr;
    PFN_cuStreamCreate_v2000 cuStreamCreate = nullptr;
    PFN_cuStreamDestroy_v4000 cuStreamDestroy_v2 = nullptr;
    PFN_cuStreamSynchronize_v2000 cuStreamSynchronize = nullptr;
    PFN_cuStreamSynchronize_v7000_ptsz cuStreamSynchronize_ptsz = nullptr;
    PFN_cuEventCreate_v2000 cuEventCreate = nullptr;
    PFN_cuEventRecord_v2000 cuEventRecord = nullptr;
    PFN_cuEventRecord_v7000_ptsz cuEventRecord_ptsz = nullptr;
    PFN_cuEventQuery_v2000 cuEventQuery = nullptr;
    PFN_cuEventSynchronize_v2000 cuEventSynchronize = nullptr;
    PFN_cuEventDestroy_v4000 cuEventDestroy_v2 = nullptr;
    PFN_cuMemcpyHtoD_v3020 cuMemcpyHtoD_v2 = nullptr;
    PFN_cuMemcpyHtoD_v7000_ptds cuMemcpyHtoD_v2_ptds = nullptr;
    PFN_cuMemcpyDtoH_v3020 cuMemcpyDtoH_v2 = nullptr;
    PFN_cuMemcpyDtoH_v7000_ptds cuMemcpyDtoH_v2_ptds = nullptr;
    PFN_cuMemcpyHtoDAsync_v3020 cuMemcpyHtoDAsync_v2 = nullptr;
    PFN_cuMemcpyHtoDAsync_v7000_ptsz cuMemcpyHtoDAsync_v2_ptsz = nullptr;
    PFN_cuMemcpyDtoHAsync_v3020 cuMemcpyDtoHAsync_v2 = nullptr;
    PFN_cuMemcpyDtoHAsync_v7000_ptsz cuMemcpyDtoHAsync_v2_ptsz = nullptr;
    PFN_cuMemsetD8_v3020 cuMemsetD8_v2 = nullptr;
    PFN_cuMemsetD8_v7000_ptds cuMemsetD8_v2_ptds = nullptr;
    PFN_cuStreamBeginCapture_v10010 cuStreamBeginCapture_v2 = nullptr;
    PFN_cuStreamBeginCapture_v10010_ptsz cuStreamBeginCapture_v2_ptsz = nullptr;
    PFN_cuStreamEndCapture_v10000 cuStreamEndCapture = nullptr;
    PFN_cuStreamEndCapture_v10000_ptsz cuStreamEndCapture_ptsz = nullptr;
    PFN_cuStreamIsCapturing_v10000 cuStreamIsCapturing = nullptr;
    PFN_cuIpcGetMemHandle_v4010 cuIpcGetMemHandle = nullptr;
};

struct RuntimeLookup {
    void* handle = nullptr;                        // of libcuda.so.1
    void* dlsym_cuGetProcAddress_v2 = nullptr;     // what the single dlsym returned
    std::vector<Lookup> lookups;                   // in TSV order (gpa lines only)
    DriverApi api;
    std::string error;                             // why replay failed, if it did

    // The last lookup of `name` with `flags` (nullptr if none).
    const Lookup* find(const std::string& name, unsigned flags) const;
};

// Where the TSV is: $FAKE_CUDA_LOOKUP_TSV if set, else the copy beside this source file
// (compile-time FAKE_CUDA_DEFAULT_TSV).
std::string default_tsv_path();

// Does the runtime's lookups; false (with out->error) if the library or TSV cannot be used.
// Individual lookup failures are not errors: compare Lookup::result with Lookup::expected.
bool replay_runtime_lookups(const std::string& tsv_path, RuntimeLookup* out, const char* library = "libcuda.so.1");

}  // namespace fakecuda
