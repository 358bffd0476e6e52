// Test-only control API of the fake CUDA driver (tests/fake_driver/libcuda.so.1).
// These are exported with C linkage; tests reach them with dlsym() on the handle of
// dlopen("libcuda.so.1").  The typedefs name the pointer types for that.
#pragma once

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {

struct fakecuda_stats_t {
    // Calls that reached the driver (every exported variant counted under its base name,
    // e.g. cuMemAlloc_v2 and cuMemAlloc both count as mem_alloc).
    uint64_t mem_alloc;          // cuMemAlloc_v2, cuMemAlloc
    uint64_t mem_free;           // cuMemFree_v2, cuMemFree
    uint64_t mem_alloc_async;    // cuMemAllocAsync(_ptsz), cuMemAllocFromPoolAsync(_ptsz)
    uint64_t mem_free_async;     // cuMemFreeAsync(_ptsz)
    uint64_t mem_alloc_managed;  // cuMemAllocManaged
    uint64_t mem_alloc_pitch;    // cuMemAllocPitch_v2
    uint64_t vm_reserve;         // cuMemAddressReserve
    uint64_t vm_address_free;    // cuMemAddressFree
    uint64_t vm_create;          // cuMemCreate
    uint64_t vm_release;         // cuMemRelease
    uint64_t vm_map;             // cuMemMap
    uint64_t vm_unmap;           // cuMemUnmap
    uint64_t vm_set_access;      // cuMemSetAccess
    uint64_t stream_sync;        // cuStreamSynchronize(_ptsz)
    uint64_t ctx_sync;           // cuCtxSynchronize(_v2)
    // State (not reset by fakecuda_reset_stats):
    uint64_t bytes_in_use;       // all devices: linear allocations (rounded) + cuMemCreate handles
    uint64_t live_allocations;   // linear allocations (cuMemAlloc*, async, managed, pitch) alive
    uint64_t live_vm_handles;    // cuMemCreate handles not yet fully released
    uint64_t peak_bytes_in_use;  // since load or last fakecuda_reset_stats
    // Pinned host memory (appended: the fields above keep their offsets).
    uint64_t host_alloc;             // cuMemHostAlloc, cuMemAllocHost(_v2) calls
    uint64_t host_free;              // cuMemFreeHost calls
    uint64_t live_host_allocations;  // state: pinned allocations alive
    uint64_t host_bytes_in_use;      // state: their bytes
};

// Fills *out.  Safe from any thread.
void fakecuda_stats(fakecuda_stats_t* out);
// Zeroes the call counters (and the peak), keeps state.
void fakecuda_reset_stats(void);
// Number of calls of one API since load/reset.  `api` is an exact export name
// ("cuMemAlloc_v2") or a base name ("cuMemAlloc": counts all its variants).
uint64_t fakecuda_call_count(const char* api);
// Fault injection: after `after_n_calls` more successful-looking calls of `api` (exact
// export name or base name as above), the next call returns `code` without doing
// anything.  One shot per registration; several registrations may be pending.
void fakecuda_fail_next(const char* api, int after_n_calls, CUresult code);
// Drops all pending fault injections.
void fakecuda_clear_failures(void);
// cuPointerGetAttribute as the driver answers it, past any interposer: the driver's own
// allocation around `ptr` (for a caching allocator's block, its segment).
CUresult fakecuda_native_pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr);

// "Kernels".  Enqueued on `stream` (0 = legacy default stream, CU_STREAM_PER_THREAD = the
// calling thread's per-thread stream) with the usual stream semantics.  When the stream
// reaches one, it sleeps `delay_us` microseconds, then acts.
// Writes `value` to [ptr, ptr+bytes).
CUresult fakecuda_launch_write(CUstream stream, CUdeviceptr ptr, size_t bytes, unsigned char value,
                               unsigned delay_us);
// Counts bytes of [ptr, ptr+bytes) that differ from `expected` and adds that count to
// *mismatches (atomically) when it runs.  `mismatches` must stay valid until then.
CUresult fakecuda_launch_fill_check(CUstream stream, CUdeviceptr ptr, size_t bytes,
                                    unsigned char expected, unsigned delay_us,
                                    unsigned long long* mismatches);
// Only sleeps.
CUresult fakecuda_launch_sleep(CUstream stream, unsigned delay_us);

typedef void (*fakecuda_stats_fn)(fakecuda_stats_t*);
typedef void (*fakecuda_reset_stats_fn)(void);
typedef uint64_t (*fakecuda_call_count_fn)(const char*);
typedef void (*fakecuda_fail_next_fn)(const char*, int, CUresult);
typedef void (*fakecuda_clear_failures_fn)(void);
typedef CUresult (*fakecuda_native_pointer_attribute_fn)(void*, CUpointer_attribute, CUdeviceptr);
typedef CUresult (*fakecuda_launch_write_fn)(CUstream, CUdeviceptr, size_t, unsigned char, unsigned);
typedef CUresult (*fakecuda_launch_fill_check_fn)(CUstream, CUdeviceptr, size_t, unsigned char,
                                                   unsigned, unsigned long long*);
typedef CUresult (*fakecuda_launch_sleep_fn)(CUstream, unsigned);

}  // extern "C"
