// Tests of the fake CUDA driver itself (no interposer).  The library is reached with
// dlopen("libcuda.so.1") through LD_LIBRARY_PATH, as a CUDA runtime would.
#define __CUDA_API_VERSION_INTERNAL 1  // declare every export under its real name
#include <cuda.h>

#include <catch2/catch.hpp>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fake_cuda_control.h"
#include "runtime_lookup.h"

namespace {

void* lib() {
    static void* h = [] {
        void* x = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!x) FAIL("dlopen libcuda.so.1: " << dlerror());
        return x;
    }();
    return h;
}

template <class F>
F sym(const char* name) {
    void* p = dlsym(lib(), name);
    if (!p) FAIL("missing export " << name);
    return reinterpret_cast<F>(p);
}

#define FN(name) static const auto name = sym<decltype(&::name)>(#name)

struct Ctl {
    fakecuda_stats_fn stats = sym<fakecuda_stats_fn>("fakecuda_stats");
    fakecuda_reset_stats_fn reset_stats = sym<fakecuda_reset_stats_fn>("fakecuda_reset_stats");
    fakecuda_call_count_fn call_count = sym<fakecuda_call_count_fn>("fakecuda_call_count");
    fakecuda_fail_next_fn fail_next = sym<fakecuda_fail_next_fn>("fakecuda_fail_next");
    fakecuda_clear_failures_fn clear_failures = sym<fakecuda_clear_failures_fn>("fakecuda_clear_failures");
    fakecuda_launch_write_fn launch_write = sym<fakecuda_launch_write_fn>("fakecuda_launch_write");
    fakecuda_launch_fill_check_fn launch_fill_check = sym<fakecuda_launch_fill_check_fn>("fakecuda_launch_fill_check");
    fakecuda_launch_sleep_fn launch_sleep = sym<fakecuda_launch_sleep_fn>("fakecuda_launch_sleep");
};
const Ctl& ctl() {
    static Ctl c;
    return c;
}

// Retains device 0's primary context and makes it current in this thread.
CUcontext use_primary(int dev = 0) {
    FN(cuInit);
    FN(cuDevicePrimaryCtxRetain);
    FN(cuCtxSetCurrent);
    REQUIRE(cuInit(0) == CUDA_SUCCESS);
    CUcontext ctx = nullptr;
    REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    return ctx;
}

// A "kernel" that blocks its stream until opened: makes "not yet run" deterministic.
struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    std::atomic<int> pending{0};  // launched waits that have not finished touching *this
    static void CUDA_CB wait_fn(void* self) {
        auto* g = static_cast<Gate*>(self);
        {
            std::unique_lock<std::mutex> lk(g->mu);
            g->cv.wait(lk, [&] { return g->open; });
        }
        g->pending.fetch_sub(1);  // last access
    }
    void block(CUstream s) {
        FN(cuLaunchHostFunc);
        pending.fetch_add(1);
        REQUIRE(cuLaunchHostFunc(s, wait_fn, this) == CUDA_SUCCESS);
    }
    ~Gate() {
        release();
        while (pending.load() != 0) std::this_thread::yield();
    }
    void release() {
        {
            std::lock_guard<std::mutex> lk(mu);
            open = true;
        }
        cv.notify_all();
    }
};

unsigned char byte_at(CUdeviceptr p) { return *reinterpret_cast<volatile unsigned char*>(p); }

}  // namespace

TEST_CASE("runtime-style lookups replay with the TSV's results", "[lookup]") {
    fakecuda::RuntimeLookup r;
    REQUIRE(fakecuda::replay_runtime_lookups(fakecuda::default_tsv_path(), &r));
    REQUIRE(r.lookups.size() == 440);
    for (const auto& l : r.lookups) {
        INFO(l.name << " v" << l.version << " flags " << l.flags);
        CHECK(l.result == l.expected);
        if (!l.name.empty() && l.result == 0) CHECK(l.pfn != nullptr);
    }
    auto resolved = [&](const char* n, int ver, unsigned fl) -> std::string {
        for (const auto& l : r.lookups)
            if (l.name == n && l.version == ver && l.flags == fl) return l.resolved;
        return "<no lookup>";
    };
    CHECK(resolved("cuGetProcAddress", 11030, 0) == "cuGetProcAddress");
    CHECK(resolved("cuGetProcAddress", 12000, 0) == "cuGetProcAddress_v2");
    CHECK(resolved("cuMemAlloc", 3020, 0) == "cuMemAlloc_v2");
    CHECK(resolved("cuMemFree", 3020, 0) == "cuMemFree_v2");
    CHECK(resolved("cuMemAllocAsync", 11020, 0) == "cuMemAllocAsync");
    CHECK(resolved("cuMemAllocAsync", 11020, 2) == "cuMemAllocAsync_ptsz");
    CHECK(resolved("cuMemFreeAsync", 11020, 2) == "cuMemFreeAsync_ptsz");
    CHECK(resolved("cuMemcpyHtoD", 7000, 2) == "cuMemcpyHtoD_v2_ptds");
    CHECK(resolved("cuMemcpyHtoDAsync", 7000, 2) == "cuMemcpyHtoDAsync_v2_ptsz");
    CHECK(resolved("cuCtxCreate", 3020, 0) == "cuCtxCreate_v2");
    CHECK(resolved("cuCtxSynchronize", 13000, 0) == "cuCtxSynchronize_v2");
    CHECK(resolved("cuStreamBeginCapture", 10010, 2) == "cuStreamBeginCapture_v2_ptsz");
    CHECK(resolved("cuStreamGetCaptureInfo", 12030, 0) == "cuStreamGetCaptureInfo_v3");
    CHECK(resolved("cuEventDestroy", 4000, 0) == "cuEventDestroy_v2");
    CHECK(r.api.cuGetProcAddress_v2 == r.dlsym_cuGetProcAddress_v2);

    // Unknown names and too-old versions, as the driver answers them.
    void* p = reinterpret_cast<void*>(1);
    CUdriverProcAddressQueryResult st;
    CHECK(r.api.cuGetProcAddress_v2("cuNoSuchFunction", &p, 13000, 0, &st) == CUDA_ERROR_NOT_FOUND);
    CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CHECK(p == nullptr);
    CHECK(r.api.cuGetProcAddress_v2("cuMemAllocAsync", &p, 11000, 0, &st) == CUDA_ERROR_NOT_FOUND);
    CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);

    // The client calls memory functions through the pointers it was given.
    auto& a = r.api;
    REQUIRE(a.cuInit(0) == CUDA_SUCCESS);
    CUcontext ctx;
    REQUIRE(a.cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
    REQUIRE(a.cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    ctl().reset_stats();
    CUdeviceptr d = 0;
    REQUIRE(a.cuMemAlloc_v2(&d, 4096) == CUDA_SUCCESS);
    std::vector<unsigned char> in(4096, 0x5a), out(4096, 0);
    REQUIRE(a.cuMemcpyHtoD_v2(d, in.data(), in.size()) == CUDA_SUCCESS);
    REQUIRE(a.cuMemcpyDtoH_v2_ptds(out.data(), d, out.size()) == CUDA_SUCCESS);
    CHECK(in == out);
    CUdeviceptr da = 0;
    REQUIRE(a.cuMemAllocAsync_ptsz(&da, 1000, nullptr) == CUDA_SUCCESS);
    REQUIRE(a.cuMemFreeAsync_ptsz(da, nullptr) == CUDA_SUCCESS);
    REQUIRE(a.cuStreamSynchronize_ptsz(nullptr) == CUDA_SUCCESS);
    REQUIRE(a.cuMemFree_v2(d) == CUDA_SUCCESS);
    fakecuda_stats_t s;
    ctl().stats(&s);
    CHECK(s.mem_alloc == 1);
    CHECK(s.mem_free == 1);
    CHECK(s.mem_alloc_async == 1);
    CHECK(s.mem_free_async == 1);
    CHECK(ctl().call_count("cuMemAllocAsync_ptsz") == 1);
    CHECK(ctl().call_count("cuMemAllocAsync") == 1);
}

TEST_CASE("cuMemAlloc/cuMemFree semantics and error codes", "[memory]") {
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    FN(cuMemGetInfo_v2);
    FN(cuMemGetAddressRange_v2);
    FN(cuPointerGetAttribute);
    FN(cuPointerGetAttributes);
    CUcontext ctx = use_primary();
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc_v2(&p, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree_v2(0) == CUDA_SUCCESS);

    // No current context in a fresh thread.
    std::thread([&] {
        CUdeviceptr q = 0;
        CHECK(cuMemAlloc_v2(&q, 512) == CUDA_ERROR_INVALID_CONTEXT);
    }).join();

    size_t free0 = 0, total = 0;
    REQUIRE(cuMemGetInfo_v2(&free0, &total) == CUDA_SUCCESS);
    CHECK(total == 1024ull << 20);  // FAKE_CUDA_MEMORY_MB=1024 in meson

    std::vector<CUdeviceptr> small;
    for (size_t sz : {1, 100, 512, 513, 4000}) {
        REQUIRE(cuMemAlloc_v2(&p, sz) == CUDA_SUCCESS);
        CHECK(p % 512 == 0);
        small.push_back(p);
    }
    CUdeviceptr big = 0;
    REQUIRE(cuMemAlloc_v2(&big, (2u << 20) + 1) == CUDA_SUCCESS);
    CHECK(big % (2u << 20) == 0);
    size_t free1 = 0;
    REQUIRE(cuMemGetInfo_v2(&free1, &total) == CUDA_SUCCESS);
    CHECK(free0 - free1 >= (2u << 20) + 1);

    CUdeviceptr base = 0;
    size_t size = 0;
    REQUIRE(cuMemGetAddressRange_v2(&base, &size, big + 12345) == CUDA_SUCCESS);
    CHECK(base == big);
    CHECK(size == (2u << 20) + 1);

    CUmemorytype mt{};
    REQUIRE(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, big + 7) == CUDA_SUCCESS);
    CHECK(mt == CU_MEMORYTYPE_DEVICE);
    CUcontext pc = nullptr;
    REQUIRE(cuPointerGetAttribute(&pc, CU_POINTER_ATTRIBUTE_CONTEXT, big) == CUDA_SUCCESS);
    CHECK(pc == ctx);
    CUdeviceptr start = 0;
    size_t rsize = 0;
    unsigned long long id1 = 0, id2 = 0;
    int ordinal = -1;
    bool managed = true;
    REQUIRE(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, big + 99) == CUDA_SUCCESS);
    REQUIRE(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, big + 99) == CUDA_SUCCESS);
    REQUIRE(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, big) == CUDA_SUCCESS);
    REQUIRE(cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, small[0]) == CUDA_SUCCESS);
    REQUIRE(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, big) == CUDA_SUCCESS);
    REQUIRE(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, big) == CUDA_SUCCESS);
    CHECK(start == big);
    CHECK(rsize == (2u << 20) + 1);
    CHECK(id1 != id2);
    CHECK(ordinal == 0);
    CHECK(!managed);
    int stack_var = 0;
    CHECK(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CUdeviceptr(&stack_var)) == CUDA_ERROR_INVALID_VALUE);
    {
        CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER};
        unsigned int t = 99;
        CUdeviceptr dp = 1;
        void* data[] = {&t, &dp};
        REQUIRE(cuPointerGetAttributes(2, attrs, data, big + 1) == CUDA_SUCCESS);
        CHECK(t == CU_MEMORYTYPE_DEVICE);
        CHECK(dp == big + 1);
        REQUIRE(cuPointerGetAttributes(2, attrs, data, CUdeviceptr(&stack_var)) == CUDA_SUCCESS);
        CHECK(t == 0);
    }

    CHECK(cuMemFree_v2(big + 512) == CUDA_ERROR_INVALID_VALUE);  // interior
    CHECK(cuMemFree_v2(big) == CUDA_SUCCESS);
    CHECK(cuMemFree_v2(big) == CUDA_ERROR_INVALID_VALUE);  // double free
    CHECK(cuMemFree_v2(0xdead0000) == CUDA_ERROR_INVALID_VALUE);  // unknown
    for (auto q : small) CHECK(cuMemFree_v2(q) == CUDA_SUCCESS);

    // Out of memory past the device total.
    CUdeviceptr huge = 0;
    CHECK(cuMemAlloc_v2(&huge, 2048ull << 20) == CUDA_ERROR_OUT_OF_MEMORY);
    CUdeviceptr a = 0, b = 0;
    REQUIRE(cuMemAlloc_v2(&a, 600ull << 20) == CUDA_SUCCESS);
    CHECK(cuMemAlloc_v2(&b, 600ull << 20) == CUDA_ERROR_OUT_OF_MEMORY);
    REQUIRE(cuMemFree_v2(a) == CUDA_SUCCESS);
    REQUIRE(cuMemAlloc_v2(&b, 600ull << 20) == CUDA_SUCCESS);
    REQUIRE(cuMemFree_v2(b) == CUDA_SUCCESS);
    size_t free2 = 0;
    REQUIRE(cuMemGetInfo_v2(&free2, &total) == CUDA_SUCCESS);
    CHECK(free2 == free0);
}

TEST_CASE("error names, device queries", "[misc]") {
    FN(cuGetErrorName);
    FN(cuGetErrorString);
    FN(cuDeviceGetCount);
    FN(cuDeviceGetAttribute);
    FN(cuDeviceTotalMem_v2);
    FN(cuDriverGetVersion);
    use_primary();
    const char* s = nullptr;
    REQUIRE(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s) == CUDA_SUCCESS);
    CHECK(std::string(s) == "CUDA_ERROR_OUT_OF_MEMORY");
    REQUIRE(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s) == CUDA_SUCCESS);
    CHECK(std::string(s) == "invalid argument");
    int n = 0, v = 0;
    REQUIRE(cuDeviceGetCount(&n) == CUDA_SUCCESS);
    CHECK(n == 1);
    REQUIRE(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) == CUDA_SUCCESS);
    CHECK(v == 1);
    CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 1) == CUDA_ERROR_INVALID_DEVICE);
    REQUIRE(cuDriverGetVersion(&v) == CUDA_SUCCESS);
    CHECK(v == 13000);
    size_t t = 0;
    REQUIRE(cuDeviceTotalMem_v2(&t, 0) == CUDA_SUCCESS);
    CHECK(t == 1024ull << 20);
}

TEST_CASE("streams run work later, in order; events complete when reached", "[streams]") {
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    FN(cuStreamCreate);
    FN(cuStreamDestroy_v2);
    FN(cuStreamSynchronize);
    FN(cuStreamQuery);
    FN(cuEventCreate);
    FN(cuEventRecord);
    FN(cuEventQuery);
    FN(cuEventSynchronize);
    FN(cuEventElapsedTime_v2);
    FN(cuEventDestroy_v2);
    FN(cuMemsetD8Async);
    FN(cuMemcpyDtoHAsync_v2);
    FN(cuStreamWaitEvent);
    use_primary();
    CUstream s = nullptr, s2 = nullptr;
    REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    REQUIRE(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    memset(reinterpret_cast<void*>(p), 0, 4096);

    Gate g;
    g.block(s);
    REQUIRE(ctl().launch_write(s, p, 4096, 0xab, 1000) == CUDA_SUCCESS);
    CUevent e1, e2;
    REQUIRE(cuEventCreate(&e1, 0) == CUDA_SUCCESS);
    REQUIRE(cuEventCreate(&e2, 0) == CUDA_SUCCESS);
    REQUIRE(cuEventRecord(e1, s) == CUDA_SUCCESS);
    CHECK(cuEventQuery(e1) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
    CHECK(byte_at(p) == 0);

    // s2 waits for e1: its write lands after s's write.
    REQUIRE(cuStreamWaitEvent(s2, e1, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemsetD8Async(p, 0xcd, 16, s2) == CUDA_SUCCESS);
    REQUIRE(cuEventRecord(e2, s2) == CUDA_SUCCESS);
    CHECK(cuEventQuery(e2) == CUDA_ERROR_NOT_READY);

    g.release();
    REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(byte_at(p + 100) == 0xab);
    CHECK(cuEventQuery(e1) == CUDA_SUCCESS);
    REQUIRE(cuEventSynchronize(e2) == CUDA_SUCCESS);
    CHECK(byte_at(p) == 0xcd);
    CHECK(byte_at(p + 16) == 0xab);
    float ms = -1;
    REQUIRE(cuEventElapsedTime_v2(&ms, e1, e2) == CUDA_SUCCESS);
    CHECK(ms >= 0);

    // Async copy back, and a fill check "kernel".
    std::vector<unsigned char> out(4096);
    REQUIRE(cuMemcpyDtoHAsync_v2(out.data(), p, out.size(), s) == CUDA_SUCCESS);
    unsigned long long mism = 0;
    REQUIRE(ctl().launch_fill_check(s, p + 16, 4096 - 16, 0xab, 0, &mism) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(out[0] == 0xcd);
    CHECK(out[4095] == 0xab);
    CHECK(mism == 0);

    REQUIRE(cuEventDestroy_v2(e1) == CUDA_SUCCESS);
    REQUIRE(cuEventDestroy_v2(e2) == CUDA_SUCCESS);
    CHECK(cuEventDestroy_v2(e2) == CUDA_ERROR_INVALID_HANDLE);
    REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy_v2(s2) == CUDA_SUCCESS);
    CHECK(cuStreamDestroy_v2(s2) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("legacy stream vs blocking and non-blocking streams", "[streams]") {
    FN(cuStreamCreate);
    FN(cuStreamDestroy_v2);
    FN(cuEventCreate);
    FN(cuEventRecord);
    FN(cuEventQuery);
    FN(cuEventSynchronize);
    FN(cuEventDestroy_v2);
    FN(cuCtxSynchronize);
    FN(cuStreamGetFlags);
    use_primary();
    CUstream blocking = nullptr, nonblocking = nullptr;
    REQUIRE(cuStreamCreate(&blocking, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
    REQUIRE(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    unsigned fl = 0;
    REQUIRE(cuStreamGetFlags(nonblocking, &fl) == CUDA_SUCCESS);
    CHECK(fl == CU_STREAM_NON_BLOCKING);
    CUevent ev;
    REQUIRE(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);

    SECTION("legacy work waits for prior blocking-stream work") {
        Gate g;
        g.block(blocking);
        REQUIRE(cuEventRecord(ev, nullptr) == CUDA_SUCCESS);
        CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);
        g.release();
        REQUIRE(cuEventSynchronize(ev) == CUDA_SUCCESS);
    }
    SECTION("legacy work does not wait for non-blocking streams") {
        Gate g;
        g.block(nonblocking);
        REQUIRE(cuEventRecord(ev, CU_STREAM_LEGACY) == CUDA_SUCCESS);
        REQUIRE(cuEventSynchronize(ev) == CUDA_SUCCESS);  // returns while the gate is shut
        g.release();
    }
    SECTION("blocking-stream work waits for prior legacy work") {
        Gate g;
        g.block(nullptr);
        REQUIRE(cuEventRecord(ev, blocking) == CUDA_SUCCESS);
        CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);
        g.release();
        REQUIRE(cuEventSynchronize(ev) == CUDA_SUCCESS);
    }
    SECTION("non-blocking-stream work does not wait for legacy work") {
        Gate g;
        g.block(nullptr);
        REQUIRE(cuEventRecord(ev, nonblocking) == CUDA_SUCCESS);
        REQUIRE(cuEventSynchronize(ev) == CUDA_SUCCESS);
        g.release();
    }
    REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
    REQUIRE(cuEventDestroy_v2(ev) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy_v2(blocking) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy_v2(nonblocking) == CUDA_SUCCESS);
}

// What tests/gpu/ctx_event_probe finds on a real GPU (driver 580).
TEST_CASE("cuCtxRecordEvent waits for the work of every stream, and only for work queued before it", "[streams]") {
    FN(cuStreamCreate);
    FN(cuStreamDestroy_v2);
    FN(cuEventCreate);
    FN(cuCtxRecordEvent);
    FN(cuEventQuery);
    FN(cuEventSynchronize);
    FN(cuEventDestroy_v2);
    FN(cuCtxSynchronize);
    FN(cuStreamBeginCapture_v2);
    FN(cuStreamEndCapture);
    FN(cuStreamIsCapturing);
    CUcontext ctx = use_primary();
    CUstream blocking = nullptr, nonblocking = nullptr;
    REQUIRE(cuStreamCreate(&blocking, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
    REQUIRE(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUevent ev;
    REQUIRE(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    // An idle context: done at once.
    REQUIRE(cuCtxRecordEvent(ctx, ev) == CUDA_SUCCESS);
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
    CUstream doomed = nullptr;
    REQUIRE(cuStreamCreate(&doomed, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    struct Case {
        const char* name;
        CUstream stream;
        bool destroy;
    };
    for (const Case& c : {Case{"legacy", CU_STREAM_LEGACY, false}, Case{"per-thread", CU_STREAM_PER_THREAD, false},
                          Case{"blocking", blocking, false}, Case{"non-blocking", nonblocking, false},
                          Case{"destroyed", doomed, true}}) {
        INFO(c.name);
        Gate g;
        g.block(c.stream);
        if (c.destroy) REQUIRE(cuStreamDestroy_v2(c.stream) == CUDA_SUCCESS);
        REQUIRE(cuCtxRecordEvent(ctx, ev) == CUDA_SUCCESS);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);
        g.release();
        REQUIRE(cuEventSynchronize(ev) == CUDA_SUCCESS);
    }
    {
        INFO("work queued after the record");
        Gate g;
        REQUIRE(cuCtxRecordEvent(ctx, ev) == CUDA_SUCCESS);
        g.block(nonblocking);
        REQUIRE(cuEventSynchronize(ev) == CUDA_SUCCESS);  // returns while the gate is shut
        g.release();
    }
    {
        INFO("a capture on a stream of the context is invalidated");
        REQUIRE(cuStreamBeginCapture_v2(nonblocking, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
        CHECK(cuCtxRecordEvent(ctx, ev) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CUstreamCaptureStatus st;
        REQUIRE(cuStreamIsCapturing(nonblocking, &st) == CUDA_SUCCESS);
        CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        CUgraph graph = nullptr;
        CHECK(cuStreamEndCapture(nonblocking, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
    REQUIRE(cuEventDestroy_v2(ev) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy_v2(blocking) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy_v2(nonblocking) == CUDA_SUCCESS);
}

TEST_CASE("cuMemFree_v2 waits for all streams, cuMemAlloc does not", "[memory][streams]") {
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    FN(cuMemAllocAsync);
    FN(cuMemFreeAsync);
    FN(cuStreamCreate);
    FN(cuStreamDestroy_v2);
    FN(cuStreamSynchronize);
    FN(cuCtxSetCurrent);
    CUcontext ctx = use_primary();
    CUstream s = nullptr;
    REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUdeviceptr p = 0, unrelated = 0;
    REQUIRE(cuMemAlloc_v2(&p, 1 << 20) == CUDA_SUCCESS);
    Gate g;
    g.block(s);
    REQUIRE(cuMemAlloc_v2(&unrelated, 4096) == CUDA_SUCCESS);  // no wait
    std::atomic<bool> returned{false};
    CUresult rc = CUDA_ERROR_UNKNOWN;
    std::thread t([&] {
        cuCtxSetCurrent(ctx);
        rc = cuMemFree_v2(unrelated);
        returned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(!returned.load());  // cannot have returned: the gate is still shut
    g.release();
    t.join();
    CHECK(rc == CUDA_SUCCESS);

    // cuMemFreeAsync of a cuMemAlloc pointer is stream-ordered; a cuMemAllocAsync pointer
    // freed with cuMemFree_v2 does not wait.
    Gate g2;
    g2.block(s);
    REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
    CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);  // already being freed
    CUdeviceptr a = 0;
    REQUIRE(cuMemAllocAsync(&a, 1000, s) == CUDA_SUCCESS);
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS);  // returns although s is blocked
    fakecuda_stats_t st;
    ctl().stats(&st);
    uint64_t live = st.live_allocations;
    g2.release();
    REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
    ctl().stats(&st);
    CHECK(st.live_allocations == live - 1);  // p released when the stream reached the free
    REQUIRE(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

TEST_CASE("reuse after free: a late write planted on a stream", "[memory][streams]") {
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    FN(cuStreamCreate);
    FN(cuStreamDestroy_v2);
    use_primary();
    CUstream s = nullptr;
    REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc_v2(&p, 8192) == CUDA_SUCCESS);
    REQUIRE(ctl().launch_write(s, p, 8192, 0x77, 5000) == CUDA_SUCCESS);
    // The native free waits for the write, so the next owner never sees it.
    REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
    CUdeviceptr q = 0;
    REQUIRE(cuMemAlloc_v2(&q, 8192) == CUDA_SUCCESS);
    CHECK(q == p);  // addresses are reused, like the driver does
    memset(reinterpret_cast<void*>(q), 0, 8192);
    CHECK(byte_at(q + 8191) == 0);
    REQUIRE(cuMemFree_v2(q) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

TEST_CASE("per-thread default stream", "[streams]") {
    FN(cuStreamGetId);
    FN(cuStreamGetId_ptsz);
    FN(cuMemsetD8_v2_ptds);
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    FN(cuEventCreate);
    FN(cuEventRecord_ptsz);
    FN(cuEventQuery);
    FN(cuEventSynchronize);
    FN(cuEventDestroy_v2);
    FN(cuStreamSynchronize_ptsz);
    FN(cuCtxSetCurrent);
    CUcontext ctx = use_primary();
    unsigned long long legacy = 0, pt = 0, pt2 = 0, other = 0;
    REQUIRE(cuStreamGetId(nullptr, &legacy) == CUDA_SUCCESS);
    REQUIRE(cuStreamGetId_ptsz(nullptr, &pt) == CUDA_SUCCESS);
    REQUIRE(cuStreamGetId(CU_STREAM_PER_THREAD, &pt2) == CUDA_SUCCESS);
    CHECK(pt == pt2);
    CHECK(pt != legacy);
    std::thread([&] {
        cuCtxSetCurrent(ctx);
        REQUIRE(cuStreamGetId_ptsz(nullptr, &other) == CUDA_SUCCESS);
    }).join();
    CHECK(other != pt);

    // Work on this thread's per-thread stream is ordered; another thread's is separate.
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    CUevent ev;
    REQUIRE(cuEventCreate(&ev, 0) == CUDA_SUCCESS);
    Gate g;
    g.block(CU_STREAM_PER_THREAD);
    REQUIRE(cuEventRecord_ptsz(ev, nullptr) == CUDA_SUCCESS);
    CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);
    std::thread([&] {
        cuCtxSetCurrent(ctx);
        CUevent e2;
        REQUIRE(cuEventCreate(&e2, 0) == CUDA_SUCCESS);
        REQUIRE(cuEventRecord_ptsz(e2, nullptr) == CUDA_SUCCESS);
        CHECK(cuEventSynchronize(e2) == CUDA_SUCCESS);  // not blocked by the other thread's gate
        cuEventDestroy_v2(e2);
    }).join();
    g.release();
    REQUIRE(cuMemsetD8_v2_ptds(p, 0x42, 4096) == CUDA_SUCCESS);
    CHECK(byte_at(p + 4095) == 0x42);
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize_ptsz(nullptr) == CUDA_SUCCESS);
    REQUIRE(cuEventDestroy_v2(ev) == CUDA_SUCCESS);
    REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
}

TEST_CASE("stream capture rules", "[capture]") {
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    FN(cuMemAllocAsync);
    FN(cuMemFreeAsync);
    FN(cuMemsetD8Async);
    FN(cuStreamCreate);
    FN(cuStreamDestroy_v2);
    FN(cuStreamSynchronize);
    FN(cuStreamBeginCapture_v2);
    FN(cuStreamEndCapture);
    FN(cuStreamIsCapturing);
    FN(cuStreamGetCaptureInfo_v3);
    FN(cuThreadExchangeStreamCaptureMode);
    FN(cuEventCreate);
    FN(cuEventRecord);
    FN(cuEventQuery);
    FN(cuEventDestroy_v2);
    FN(cuGraphInstantiateWithFlags);
    FN(cuGraphLaunch);
    FN(cuGraphExecDestroy);
    FN(cuGraphDestroy);
    FN(cuCtxSetCurrent);
    CUcontext ctx = use_primary();
    CUstream s = nullptr;
    REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUdeviceptr keep = 0;
    REQUIRE(cuMemAlloc_v2(&keep, 4096) == CUDA_SUCCESS);
    CUstreamCaptureStatus st;
    CUgraph graph = nullptr;

    SECTION("cuMemAlloc/cuMemFree during a global capture fail and invalidate it") {
        REQUIRE(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
        REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
        CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
        CUdeviceptr p = 0;
        CHECK(cuMemAlloc_v2(&p, 512) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
        CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        CHECK(cuMemFree_v2(keep) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        CHECK(graph == nullptr);
        // From another thread too (global mode).
        REQUIRE(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
        std::thread([&] {
            cuCtxSetCurrent(ctx);
            CUdeviceptr q = 0;
            CHECK(cuMemAlloc_v2(&q, 512) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }).join();
        CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    SECTION("relaxed threads and other threads' thread-local captures are not affected") {
        REQUIRE(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
        CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
        CUdeviceptr p = 0;
        REQUIRE(cuMemAlloc_v2(&p, 512) == CUDA_SUCCESS);
        REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
        REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
        REQUIRE(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
        REQUIRE(cuGraphDestroy(graph) == CUDA_SUCCESS);

        REQUIRE(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
        std::thread([&] {
            cuCtxSetCurrent(ctx);
            CUdeviceptr q = 0;
            CHECK(cuMemAlloc_v2(&q, 512) == CUDA_SUCCESS);
            CHECK(cuMemFree_v2(q) == CUDA_SUCCESS);
        }).join();
        CHECK(cuMemAlloc_v2(&p, 512) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    SECTION("async alloc/free become graph nodes; work is replayed by cuGraphLaunch") {
        REQUIRE(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
        cuuint64_t id = 0;
        CUgraph cg = nullptr;
        REQUIRE(cuStreamGetCaptureInfo_v3(s, &st, &id, &cg, nullptr, nullptr, nullptr) == CUDA_SUCCESS);
        CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
        CHECK(id != 0);
        CUdeviceptr p = 0;
        REQUIRE(cuMemAllocAsync(&p, 1024, s) == CUDA_SUCCESS);
        CHECK(p != 0);
        memset(reinterpret_cast<void*>(keep), 0, 4096);
        REQUIRE(cuMemsetD8Async(keep, 0x11, 4096, s) == CUDA_SUCCESS);
        CUevent ev;
        REQUIRE(cuEventCreate(&ev, 0) == CUDA_SUCCESS);
        REQUIRE(cuEventRecord(ev, s) == CUDA_SUCCESS);
        REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
        CHECK(byte_at(keep) == 0);  // captured, not run
        REQUIRE(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
        REQUIRE(graph != nullptr);
        CHECK(cg == graph);
        CUgraphExec exec = nullptr;
        REQUIRE(cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS);
        REQUIRE(cuGraphLaunch(exec, s) == CUDA_SUCCESS);
        REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
        CHECK(byte_at(keep + 4095) == 0x11);
        REQUIRE(cuGraphExecDestroy(exec) == CUDA_SUCCESS);
        REQUIRE(cuGraphDestroy(graph) == CUDA_SUCCESS);
        REQUIRE(cuEventDestroy_v2(ev) == CUDA_SUCCESS);
    }
    SECTION("synchronizing a capturing stream or querying a captured event invalidates") {
        REQUIRE(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
        CHECK(cuStreamSynchronize(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        REQUIRE(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
        CUevent ev;
        REQUIRE(cuEventCreate(&ev, 0) == CUDA_SUCCESS);
        REQUIRE(cuEventRecord(ev, s) == CUDA_SUCCESS);
        CHECK(cuEventQuery(ev) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        REQUIRE(cuEventDestroy_v2(ev) == CUDA_SUCCESS);
        CHECK(cuStreamBeginCapture_v2(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_ILLEGAL_STATE);
    }
    REQUIRE(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
    CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);
    REQUIRE(cuMemFree_v2(keep) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

TEST_CASE("virtual memory management", "[vm]") {
    FN(cuMemGetAllocationGranularity);
    FN(cuMemAddressReserve);
    FN(cuMemAddressFree);
    FN(cuMemCreate);
    FN(cuMemRelease);
    FN(cuMemMap);
    FN(cuMemUnmap);
    FN(cuMemSetAccess);
    FN(cuMemGetAccess);
    FN(cuMemGetInfo_v2);
    FN(cuMemcpyHtoD_v2);
    FN(cuMemGetAddressRange_v2);
    use_primary();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    REQUIRE(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
    REQUIRE(gran == (2u << 20));

    ctl().reset_stats();
    CUdeviceptr va = 0;
    CHECK(cuMemAddressReserve(&va, gran + 1, 0, 0, 0) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cuMemAddressReserve(&va, 8 * gran, 16 * gran, 0, 0) == CUDA_SUCCESS);
    CHECK(va % (16 * gran) == 0);

    CUmemGenericAllocationHandle h1 = 0, h2 = 0, h3 = 0;
    CHECK(cuMemCreate(&h1, gran / 2, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
    size_t free0 = 0, total = 0;
    REQUIRE(cuMemGetInfo_v2(&free0, &total) == CUDA_SUCCESS);
    REQUIRE(cuMemCreate(&h1, 2 * gran, &prop, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemCreate(&h2, gran, &prop, 0) == CUDA_SUCCESS);
    size_t free1 = 0;
    REQUIRE(cuMemGetInfo_v2(&free1, &total) == CUDA_SUCCESS);
    CHECK(free0 - free1 == 3 * gran);
    CHECK(cuMemCreate(&h3, total, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);

    CHECK(cuMemMap(va + 1, gran, 0, h1, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemMap(va, 3 * gran, 0, h1, 0) == CUDA_ERROR_INVALID_VALUE);  // larger than handle
    REQUIRE(cuMemMap(va, 2 * gran, 0, h1, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(va + gran, gran, 0, h2, 0) == CUDA_ERROR_INVALID_VALUE);  // overlaps
    REQUIRE(cuMemMap(va + 2 * gran, gran, 0, h2, 0) == CUDA_SUCCESS);
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    REQUIRE(cuMemSetAccess(va, 3 * gran, &acc, 1) == CUDA_SUCCESS);
    CHECK(cuMemSetAccess(va, 4 * gran, &acc, 1) == CUDA_ERROR_INVALID_VALUE);  // not all mapped
    unsigned long long fl = 0;
    REQUIRE(cuMemGetAccess(&fl, &prop.location, va + gran) == CUDA_SUCCESS);
    CHECK(fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    std::vector<unsigned char> buf(3 * gran, 0x3c);
    REQUIRE(cuMemcpyHtoD_v2(va, buf.data(), buf.size()) == CUDA_SUCCESS);  // spans two mappings
    CHECK(byte_at(va + 3 * gran - 1) == 0x3c);
    CUdeviceptr base = 0;
    size_t sz = 0;
    REQUIRE(cuMemGetAddressRange_v2(&base, &sz, va + 2 * gran + 5) == CUDA_SUCCESS);
    CHECK(base == va + 2 * gran);
    CHECK(sz == gran);

    // Releasing a mapped handle keeps the memory until it is unmapped.
    REQUIRE(cuMemRelease(h1) == CUDA_SUCCESS);
    CHECK(cuMemRelease(h1) == CUDA_ERROR_INVALID_VALUE);
    CHECK(byte_at(va) == 0x3c);
    CHECK(cuMemUnmap(va, gran) == CUDA_ERROR_INVALID_VALUE);  // not exactly a mapping
    CHECK(cuMemAddressFree(va, 8 * gran) == CUDA_ERROR_INVALID_VALUE);  // still mapped
    REQUIRE(cuMemUnmap(va, 3 * gran) == CUDA_SUCCESS);  // both whole mappings
    CHECK(cuMemUnmap(va, 2 * gran) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cuMemRelease(h2) == CUDA_SUCCESS);
    size_t free2 = 0;
    REQUIRE(cuMemGetInfo_v2(&free2, &total) == CUDA_SUCCESS);
    CHECK(free2 == free0);

    // Fault injection: the 3rd cuMemMap fails.
    REQUIRE(cuMemCreate(&h3, 4 * gran, &prop, 0) == CUDA_SUCCESS);
    ctl().fail_next("cuMemMap", 2, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemMap(va, gran, 0, h3, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(va + gran, gran, gran, h3, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(va + 2 * gran, gran, 2 * gran, h3, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemMap(va + 2 * gran, gran, 2 * gran, h3, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemUnmap(va, 3 * gran) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(h3) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressFree(va, 8 * gran) == CUDA_SUCCESS);
    fakecuda_stats_t st;
    ctl().stats(&st);
    CHECK(st.vm_map == 9);
    CHECK(st.vm_unmap == 4);
    CHECK(st.vm_create == 5);
    CHECK(st.vm_release == 4);
    CHECK(st.vm_reserve == 2);
    CHECK(st.live_vm_handles == 0);

    // Other APIs can fail on demand too.
    FN(cuMemAlloc_v2);
    ctl().fail_next("cuMemAlloc", 0, CUDA_ERROR_OUT_OF_MEMORY);
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc_v2(&p, 512) == CUDA_ERROR_OUT_OF_MEMORY);
    ctl().fail_next("cuMemAlloc_v2", 5, CUDA_ERROR_OUT_OF_MEMORY);
    ctl().clear_failures();
}

TEST_CASE("shareable handles: a POSIX fd exported, imported and mapped elsewhere", "[vm][ipc]") {
    // In the order of use.
    FN(cuMemCreate);
    FN(cuMemExportToShareableHandle);
    FN(cuMemGetInfo_v2);
    FN(cuMemImportFromShareableHandle);
    FN(cuMemAddressReserve);
    FN(cuMemMap);
    FN(cuMemRelease);
    FN(cuMemSetAccess);
    FN(cuMemsetD8_v2);
    FN(cuMemUnmap);
    FN(cuMemAddressFree);
    use_primary();
    const size_t gran = 2u << 20;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle plain = 0, shared = 0, imported = 0;
    REQUIRE(cuMemCreate(&plain, gran, &prop, 0) == CUDA_SUCCESS);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    CHECK(cuMemCreate(&shared, gran, &prop, 0) == CUDA_ERROR_NOT_SUPPORTED);
    prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(0x100);
    CHECK(cuMemCreate(&shared, gran, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    REQUIRE(cuMemCreate(&shared, gran, &prop, 0) == CUDA_SUCCESS);

    int fd = -1;
    const auto posix = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CHECK(cuMemExportToShareableHandle(&fd, plain, posix, 0) == CUDA_ERROR_INVALID_VALUE);  // not made exportable
    CHECK(cuMemExportToShareableHandle(&fd, shared, posix, 1) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemExportToShareableHandle(nullptr, shared, posix, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_FABRIC, 0) == CUDA_ERROR_NOT_SUPPORTED);
    REQUIRE(cuMemExportToShareableHandle(&fd, shared, posix, 0) == CUDA_SUCCESS);
    REQUIRE(fd >= 0);
    CHECK(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(uintptr_t(0)), posix) ==
          CUDA_ERROR_INVALID_VALUE);  // stdin is no exported memory
    size_t free0 = 0, total = 0;
    REQUIRE(cuMemGetInfo_v2(&free0, &total) == CUDA_SUCCESS);
    REQUIRE(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(uintptr_t(fd)), posix) == CUDA_SUCCESS);
    close(fd);  // the handle keeps the memory
    size_t free1 = 0;
    REQUIRE(cuMemGetInfo_v2(&free1, &total) == CUDA_SUCCESS);
    CHECK(free1 == free0);  // not new memory

    CUdeviceptr a = 0, b = 0;
    REQUIRE(cuMemAddressReserve(&a, gran, 0, 0, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressReserve(&b, gran, 0, 0, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemMap(a, gran, 0, shared, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemMap(b, gran, 0, imported, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(imported) == CUDA_SUCCESS);  // the mapping holds it
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    REQUIRE(cuMemSetAccess(a, gran, &acc, 1) == CUDA_SUCCESS);
    REQUIRE(cuMemSetAccess(b, gran, &acc, 1) == CUDA_SUCCESS);
    REQUIRE(cuMemsetD8_v2(a, 0x6b, gran) == CUDA_SUCCESS);
    CHECK(byte_at(b + gran - 1) == 0x6b);  // one memory, two addresses
    REQUIRE(cuMemUnmap(a, gran) == CUDA_SUCCESS);
    REQUIRE(cuMemUnmap(b, gran) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(shared) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(plain) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressFree(a, gran) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressFree(b, gran) == CUDA_SUCCESS);
}

TEST_CASE("context reset kills old pointers", "[memory]") {
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    FN(cuDevicePrimaryCtxReset_v2);
    FN(cuCtxSynchronize);
    use_primary();
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS);
    use_primary();
    CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
    // Streams still work after the reset.
    REQUIRE(ctl().launch_sleep(nullptr, 100) == CUDA_SUCCESS);
    REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
}

TEST_CASE("fork: the child shares device memory but cannot use CUDA", "[fork]") {
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    FN(cuInit);
    FN(cuMemsetD8_v2);
    use_primary();
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemsetD8_v2(p, 1, 4096) == CUDA_SUCCESS);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        memset(reinterpret_cast<void*>(p), 2, 4096);
        int rc = 0;
        if (cuInit(0) != CUDA_ERROR_NOT_INITIALIZED) rc |= 1;
        if (cuMemsetD8_v2(p, 3, 4096) != CUDA_ERROR_NOT_INITIALIZED) rc |= 2;
        _exit(rc);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(byte_at(p + 4095) == 2);
    REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
}

TEST_CASE("IPC handles across processes", "[ipc]") {
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    FN(cuMemsetD8_v2);
    FN(cuIpcGetMemHandle);
    FN(cuIpcOpenMemHandle_v2);
    FN(cuIpcCloseMemHandle);
    use_primary();
    const size_t n = 3 * 4096 + 100;
    CUdeviceptr keep = 0, p = 0;
    REQUIRE(cuMemAlloc_v2(&keep, 700) == CUDA_SUCCESS);  // so p is not at the arena start
    REQUIRE(cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    REQUIRE(cuMemsetD8_v2(p, 0x21, n) == CUDA_SUCCESS);

    CUipcMemHandle h, hi;
    REQUIRE(cuIpcGetMemHandle(&h, p) == CUDA_SUCCESS);
    REQUIRE(cuIpcGetMemHandle(&hi, p + 1000) == CUDA_SUCCESS);  // interior: names the whole allocation
    CHECK(memcmp(&h, &hi, sizeof h) == 0);
    int on_stack = 0;
    CHECK(cuIpcGetMemHandle(&hi, CUdeviceptr(&on_stack)) == CUDA_ERROR_INVALID_VALUE);

    // Same process: the original mapping.
    CUdeviceptr same = 0;
    REQUIRE(cuIpcOpenMemHandle_v2(&same, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    CHECK(same == p);
    REQUIRE(cuIpcCloseMemHandle(same) == CUDA_SUCCESS);

    const char* child = std::getenv("FAKE_IPC_CHILD");
    REQUIRE(child != nullptr);
    char hex[2 * CU_IPC_HANDLE_SIZE + 1];
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h.reserved[i]);
    std::string size_s = std::to_string(n);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execl(child, child, hex, size_s.c_str(), "33", "85", static_cast<char*>(nullptr));
        _exit(99);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(byte_at(p) == 85);
    CHECK(byte_at(p + n - 1) == 85);
    CHECK(byte_at(keep) != 85);
    REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
    REQUIRE(cuMemFree_v2(keep) == CUDA_SUCCESS);
}

TEST_CASE("a green context's end leaves its streams detached, their queued work still running", "[green]") {
    FN(cuGreenCtxCreate);
    FN(cuGreenCtxDestroy);
    FN(cuGreenCtxStreamCreate);
    FN(cuStreamQuery);
    FN(cuStreamDestroy_v2);
    FN(cuEventCreate);
    FN(cuEventRecord);
    FN(cuEventSynchronize);
    FN(cuEventDestroy_v2);
    FN(cuMemAlloc_v2);
    FN(cuMemFree_v2);
    use_primary();
    CUgreenCtx green = nullptr;
    REQUIRE(cuGreenCtxCreate(&green, CUdevResourceDesc{}, 0, CU_GREEN_CTX_DEFAULT_STREAM) == CUDA_SUCCESS);
    CUstream gs = nullptr;
    REQUIRE(cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0) == CUDA_SUCCESS);
    CUdeviceptr p = 0;
    REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    std::memset(reinterpret_cast<void*>(p), 0, 4096);  // device memory is the host's here
    CUevent e = nullptr;
    REQUIRE(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    {
        Gate g;
        g.block(gs);
        REQUIRE(ctl().launch_write(gs, p, 4096, 0xAA, 0) == CUDA_SUCCESS);
        REQUIRE(cuEventRecord(e, gs) == CUDA_SUCCESS);
        // Returns with the stream's work still queued: the end does not wait for it.
        REQUIRE(cuGreenCtxDestroy(green) == CUDA_SUCCESS);
        CHECK(byte_at(p) == 0);
        // The handle is known, but every call on it fails (CUDA 13's cuda.h).
        CHECK(cuStreamQuery(gs) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
        CHECK(cuEventRecord(e, gs) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
        CHECK(ctl().launch_sleep(gs, 0) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
        CHECK(cuStreamDestroy_v2(gs) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
        g.release();
        // The work queued before the end still runs.
        REQUIRE(cuEventSynchronize(e) == CUDA_SUCCESS);
        CHECK(byte_at(p) == 0xAA);
    }
    REQUIRE(cuEventDestroy_v2(e) == CUDA_SUCCESS);
    REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
}

// One granule of device 0's memory mapped at a reservation of its own, read-write for device 0.
struct MappedGranule {
    static constexpr size_t kBytes = 2u << 20;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    MappedGranule() {
        FN(cuMemAddressReserve);
        FN(cuMemCreate);
        FN(cuMemMap);
        FN(cuMemSetAccess);
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        REQUIRE(cuMemAddressReserve(&va, kBytes, 0, 0, 0) == CUDA_SUCCESS);
        REQUIRE(cuMemCreate(&h, kBytes, &prop, 0) == CUDA_SUCCESS);
        REQUIRE(cuMemMap(va, kBytes, 0, h, 0) == CUDA_SUCCESS);
        CUmemAccessDesc acc{prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        REQUIRE(cuMemSetAccess(va, kBytes, &acc, 1) == CUDA_SUCCESS);
    }
    ~MappedGranule() {
        FN(cuMemUnmap);
        FN(cuMemRelease);
        FN(cuMemAddressFree);
        CHECK(cuMemUnmap(va, kBytes) == CUDA_SUCCESS);
        CHECK(cuMemRelease(h) == CUDA_SUCCESS);
        CHECK(cuMemAddressFree(va, kBytes) == CUDA_SUCCESS);
    }
};

// FAKE_CUDA_DEVICES=2 (test fake_driver_peer). Enabling peer access does not open another
// device's virtual memory to kernels: only cuMemSetAccess for that device does, per device.
TEST_CASE("peer access and virtual memory access per device", "[peer]") {
    FN(cuDeviceGetCount);
    FN(cuDeviceCanAccessPeer);
    FN(cuCtxEnablePeerAccess);
    FN(cuCtxDisablePeerAccess);
    FN(cuCtxSetCurrent);
    FN(cuCtxSynchronize);
    FN(cuMemSetAccess);
    FN(cuMemGetAccess);
    CUcontext ctx0 = use_primary(0);
    int n = 0, can = -1;
    REQUIRE(cuDeviceGetCount(&n) == CUDA_SUCCESS);
    REQUIRE(n == 2);
    REQUIRE(cuDeviceCanAccessPeer(&can, 1, 0) == CUDA_SUCCESS);
    CHECK(can == 1);
    REQUIRE(cuDeviceCanAccessPeer(&can, 0, 0) == CUDA_SUCCESS);
    CHECK(can == 0);

    MappedGranule m;
    const size_t gran = MappedGranule::kBytes;
    const CUdeviceptr va = m.va;
    REQUIRE(ctl().launch_write(nullptr, va, gran, 0x11, 0) == CUDA_SUCCESS);
    REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);

    CUcontext ctx1 = use_primary(1);
    CHECK(ctl().launch_write(nullptr, va, gran, 0x22, 0) == CUDA_ERROR_ILLEGAL_ADDRESS);
    REQUIRE(cuCtxEnablePeerAccess(ctx0, 0) == CUDA_SUCCESS);
    CHECK(cuCtxEnablePeerAccess(ctx0, 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    CHECK(cuCtxEnablePeerAccess(ctx1, 0) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(ctl().launch_write(nullptr, va, gran, 0x22, 0) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CUmemAccessDesc acc{};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 1;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    REQUIRE(cuMemSetAccess(va, gran, &acc, 1) == CUDA_SUCCESS);
    REQUIRE(ctl().launch_write(nullptr, va, gran, 0x22, 0) == CUDA_SUCCESS);
    REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(byte_at(va + gran - 1) == 0x22);
    unsigned long long fl = 0;
    CUmemLocation dev0{CU_MEM_LOCATION_TYPE_DEVICE, 0};
    REQUIRE(cuMemGetAccess(&fl, &dev0, va) == CUDA_SUCCESS);  // device 0 kept its own
    CHECK(fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    REQUIRE(cuMemSetAccess(va, gran, &acc, 1) == CUDA_SUCCESS);
    CHECK(ctl().launch_write(nullptr, va, gran, 0x33, 0) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(byte_at(va) == 0x22);  // the host still sees it through device 0's access
    REQUIRE(cuCtxDisablePeerAccess(ctx0) == CUDA_SUCCESS);
    CHECK(cuCtxDisablePeerAccess(ctx0) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    REQUIRE(cuCtxSetCurrent(ctx0) == CUDA_SUCCESS);
}
