// A fake CUDA driver (libcuda.so.1) for tests on machines without a GPU.
//
// Device memory is host memory: each device owns an "arena", a memfd of the device's total
// size mapped MAP_SHARED, and linear allocations are carved out of it (so device pointers
// are ordinary host addresses, a fork child shares them, and another process can map them
// through /proc/<pid>/fd/<fd> for cuIpcOpenMemHandle).  Streams are FIFOs run later by one
// worker thread each.  See README.md in this folder for the semantics implemented.

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "fake_cuda_control.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#define FK_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr size_t kMiB = 1024 * 1024;
constexpr size_t kLargeAlign = 2 * kMiB;
constexpr size_t kSmallAlign = 512;

// ---------------------------------------------------------------------------------------
// Process state flags, call accounting and fault injection
// ---------------------------------------------------------------------------------------
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_forked_child{false};
std::atomic<bool> g_deinit{false};

struct Fault {
    std::string api;
    int remaining;
    CUresult code;
};

struct Accounting {
    std::mutex mu;
    std::unordered_map<std::string, uint64_t> calls;  // by exact export name
    std::vector<Fault> faults;
    uint64_t peak = 0;
};
Accounting& acct() {
    static Accounting* a = new Accounting;  // leaked: usable during exit
    return *a;
}

std::string base_name(const char* name) {
    std::string s(name);
    for (;;) {
        bool changed = false;
        for (const char* suf : {"_ptds", "_ptsz"}) {
            size_t n = strlen(suf);
            if (s.size() > n && s.compare(s.size() - n, n, suf) == 0) {
                s.resize(s.size() - n);
                changed = true;
            }
        }
        size_t v = s.rfind("_v");
        if (v != std::string::npos && v + 2 < s.size() &&
            std::all_of(s.begin() + v + 2, s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
            s.resize(v);
            changed = true;
        }
        if (!changed) return s;
    }
}

// Returns CUDA_SUCCESS when the call may proceed.
CUresult enter(const char* fn, bool needs_init) {
    if (g_forked_child.load(std::memory_order_relaxed)) return CUDA_ERROR_NOT_INITIALIZED;
    if (g_deinit.load(std::memory_order_relaxed)) return CUDA_ERROR_DEINITIALIZED;
    Accounting& a = acct();
    {
        std::lock_guard<std::mutex> lk(a.mu);
        ++a.calls[fn];
        if (!a.faults.empty()) {
            std::string base = base_name(fn);
            for (auto it = a.faults.begin(); it != a.faults.end(); ++it) {
                if (it->api != fn && it->api != base) continue;
                if (it->remaining-- == 0) {
                    CUresult code = it->code;
                    a.faults.erase(it);
                    return code;
                }
            }
        }
    }
    if (needs_init && !g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

#define FK_ENTER()                                                  \
    do {                                                            \
        CUresult fk_r_ = enter(__func__, true);                     \
        if (fk_r_ != CUDA_SUCCESS) return fk_r_;                    \
    } while (0)
#define FK_ENTER_NOINIT()                                           \
    do {                                                            \
        CUresult fk_r_ = enter(__func__, false);                    \
        if (fk_r_ != CUDA_SUCCESS) return fk_r_;                    \
    } while (0)

// ---------------------------------------------------------------------------------------
// Core objects
// ---------------------------------------------------------------------------------------
struct Stream;
struct Ctx;
struct Graph;

// The big lock: guards devices, contexts, allocations, stream registry, captures and
// every submission (so that cross-stream dependencies are computed consistently).
std::mutex g_mu;
// Progress of all streams: notified whenever any stream completes an operation. Leaked on
// purpose, as drv() is: detached stream workers may still notify it during and after exit,
// which a static destructor of the condition variable would race with.
struct Progress {
    std::mutex mu;
    std::condition_variable cv;
};
Progress& prog() {
    static Progress* p = new Progress;
    return *p;
}

struct Dep {
    std::shared_ptr<Stream> s;
    uint64_t seq;
};

struct Op {
    uint64_t seq = 0;
    std::vector<Dep> deps;
    std::function<void()> fn;
};

struct Capture {
    uint64_t id;
    CUstreamCaptureMode mode;
    std::thread::id owner;
    bool invalidated = false;
    Graph* graph;
    Stream* origin;
};

struct Graph {
    std::vector<std::function<void()>> ops;  // replayed by cuGraphLaunch
    std::vector<CUdeviceptr> freed_in_graph;  // cuMemFreeAsync nodes: freed at cuGraphDestroy
    size_t alloc_nodes = 0;
};

struct GraphExec {
    std::vector<std::function<void()>> ops;
};

struct Stream : std::enable_shared_from_this<Stream> {
    Ctx* ctx = nullptr;
    unsigned flags = 0;
    int priority = 0;
    bool legacy = false;
    bool per_thread = false;
    // A stream of a green context that was destroyed while the stream lived: the handle stays
    // known, every call on it fails, and work queued before still runs (cuGreenCtxDestroy).
    bool detached = false;
    uint64_t id = 0;
    std::shared_ptr<Capture> capture;  // guarded by g_mu

    std::mutex mu;  // guards queue, worker_started, destroyed
    std::condition_variable cv;
    std::deque<Op> queue;
    bool worker_started = false;
    bool destroyed = false;
    uint64_t submitted = 0;            // guarded by g_mu (all submissions hold it)
    std::atomic<uint64_t> completed{0};

    bool blocking() const { return legacy || per_thread || !(flags & CU_STREAM_NON_BLOCKING); }

    void push(Op op) {
        std::unique_lock<std::mutex> lk(mu);
        queue.push_back(std::move(op));
        if (!worker_started) {
            worker_started = true;
            std::thread([self = shared_from_this()] { self->run(); }).detach();
        }
        cv.notify_one();
    }

    void run() {
        for (;;) {
            Op op;
            {
                std::unique_lock<std::mutex> lk(mu);
                cv.wait(lk, [&] { return !queue.empty() || destroyed; });
                if (queue.empty()) return;  // destroyed and drained
                op = std::move(queue.front());
                queue.pop_front();
            }
            for (const Dep& d : op.deps) {
                std::unique_lock<std::mutex> lk(prog().mu);
                prog().cv.wait(lk, [&] { return d.s->completed.load() >= d.seq; });
            }
            if (op.fn && !g_forked_child.load()) op.fn();
            {
                std::lock_guard<std::mutex> lk(prog().mu);
                completed.store(op.seq);
            }
            prog().cv.notify_all();
        }
    }

    void retire() {
        std::lock_guard<std::mutex> lk(mu);
        destroyed = true;
        cv.notify_one();
    }
};

void wait_reached(const std::shared_ptr<Stream>& s, uint64_t seq) {
    if (s->completed.load() >= seq) return;
    std::unique_lock<std::mutex> lk(prog().mu);
    prog().cv.wait(lk, [&] { return s->completed.load() >= seq; });
}

struct Device;

struct Ctx {
    int dev = 0;
    bool primary = false;
    // A green context: its allocations are this primary context's, which also waits for its
    // work when synchronized (as the driver does).
    Ctx* green_of = nullptr;
    // Atomic: current_ctx() reads it without g_mu (writes hold g_mu, or precede publication),
    // while another thread's cuDevicePrimaryCtxRetain may set it.
    std::atomic<bool> alive{true};
    unsigned flags = 0;
    uint64_t id = 0;
    std::shared_ptr<Stream> legacy;
    std::set<Stream*> streams;  // user-created and per-thread streams (not legacy)
    // Destroyed streams whose queued work may still run: the context's synchronization (and
    // cuMemFree's) waits for it, as the driver's does.
    std::vector<std::shared_ptr<Stream>> retired;
    // Where cuCtxRecordEvent's records are queued: a stream of no one's, made at the first.
    std::shared_ptr<Stream> marker;
    // Contexts of other devices whose memory this one may access (cuCtxEnablePeerAccess).
    std::set<Ctx*> peers;
};

enum class Kind { Linear, Async, Managed, Pitch };

struct Alloc {
    CUdeviceptr base;
    size_t size;       // requested size
    size_t rounded;    // accounted size
    size_t arena_off;  // offset in the device arena
    Ctx* ctx;
    Kind kind;
    uint64_t buffer_id;
    bool free_pending = false;  // cuMemFreeAsync queued
};

struct VmHandle {
    int dev;
    size_t size;
    int fd;
    int refs = 1;        // 1 for the handle itself + 1 per mapping + 1 per retain
    bool released = false;
    bool exportable = false;  // made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    bool imported = false;    // another process's memory: not counted against this one's device
    int retains = 0;     // cuMemRetainAllocationHandle references not yet released
};

struct VmMapping {
    CUdeviceptr base;
    size_t size;
    VmHandle* handle;
    size_t offset;
    unsigned long long access = CU_MEM_ACCESS_FLAGS_PROT_NONE;  // the widest of by_dev
    uint64_t buffer_id;
    // Access per device, as cuMemSetAccess set it (devices absent: none). A launch from a
    // device without access fails (launch()), as a kernel touching ungranted memory faults.
    std::map<int, unsigned long long> by_dev{};
};

struct Reservation {
    CUdeviceptr base;
    size_t size;
};

struct IpcImport {
    CUdeviceptr base;
    size_t size;
    void* map_base;  // what to munmap (nullptr when the mapping is our own allocation)
    size_t map_len;
    int refs;
};

struct Device {
    int ordinal;
    size_t total;
    size_t used = 0;
    int arena_fd = -1;
    char* arena = nullptr;
    std::map<size_t, size_t> free_ranges;  // offset -> length, coalesced
    Ctx primary;
    int primary_refs = 0;
    unsigned primary_flags = 0;
    bool vmm = true;  // virtual memory management (FAKE_CUDA_NO_VMM lists those without)
};

struct Driver {
    int ndev = 1;
    size_t mem_bytes = 4096 * kMiB;
    size_t vm_gran = kLargeAlign;
    std::vector<std::unique_ptr<Device>> devices;
    std::map<CUdeviceptr, Alloc> allocs;  // by base
    std::map<CUdeviceptr, VmMapping> mappings;
    std::map<CUdeviceptr, Reservation> reservations;
    std::map<CUdeviceptr, IpcImport> imports;
    struct HostAlloc {
        size_t size;
        unsigned flags;
    };
    std::map<void*, HostAlloc> host_allocs;  // pinned host memory (cuMemHostAlloc, cuMemAllocHost)
    uint64_t host_bytes = 0;
    std::unordered_map<Stream*, std::shared_ptr<Stream>> streams;
    std::set<Ctx*> ctxs;  // non-primary contexts alive
    std::set<Ctx*> greens;  // green contexts alive
    std::set<VmHandle*> vm_handles;
    std::set<Graph*> graphs;
    std::set<GraphExec*> graph_execs;
    std::set<std::shared_ptr<Capture>> captures;  // active or invalidated, not yet ended
    uint64_t next_buffer_id = 1;
    uint64_t next_stream_id = 1;
    uint64_t next_capture_id = 1;
    uint64_t next_ctx_id = 1;
    // stats
    uint64_t live_allocations = 0;
};

Driver& drv() {
    static Driver* d = new Driver;  // leaked on purpose: worker threads may outlive exit
    return *d;
}

size_t env_size(const char* name, size_t def) {
    const char* v = getenv(name);
    if (!v || !*v) return def;
    char* end = nullptr;
    unsigned long long x = strtoull(v, &end, 10);
    return (end && *end == 0 && x > 0) ? size_t(x) : def;
}

// Whether `ordinal` is listed in $FAKE_CUDA_NO_VMM ("1", "0,1"): a device without virtual
// memory management, as some vGPU and older setups are.
bool env_lacks_vmm(int ordinal) {
    const char* v = getenv("FAKE_CUDA_NO_VMM");
    while (v && *v) {
        char* end = nullptr;
        const long x = strtol(v, &end, 10);
        if (end == v) break;
        if (x == ordinal) return true;
        v = *end == ',' ? end + 1 : end;
    }
    return false;
}

void note_usage_locked() {
    uint64_t used = 0;
    for (auto& d : drv().devices) used += d->used;
    Accounting& a = acct();
    std::lock_guard<std::mutex> lk(a.mu);
    a.peak = std::max(a.peak, used);
}

// --- per-thread state -------------------------------------------------------------------
// The thread-locals use the initial-exec TLS model: in this dlopen()ed library the default
// model puts them in a malloc()ed block that glibc frees when it trims its cache of exited
// threads' stacks, from whatever thread does that, synchronised by a lock TSan cannot see; it
// reported that free as racing with ~PerThreadStreams. Initial-exec TLS lives in the static
// TLS area of the thread's stack block instead (the few bytes here fit the surplus glibc
// keeps for dlopen()).
#define FK_TLS [[gnu::tls_model("initial-exec")]] thread_local
FK_TLS std::vector<Ctx*> t_ctx_stack;
FK_TLS CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

struct PerThreadStreams {
    std::map<Ctx*, std::shared_ptr<Stream>> by_ctx;
    ~PerThreadStreams() {
        if (g_forked_child.load() || g_deinit.load()) return;
        std::lock_guard<std::mutex> lk(g_mu);
        for (auto& [ctx, s] : by_ctx) {
            ctx->streams.erase(s.get());
            drv().streams.erase(s.get());
            s->retire();
        }
    }
};
FK_TLS PerThreadStreams t_pts;

Ctx* current_ctx() {
    if (t_ctx_stack.empty()) return nullptr;
    Ctx* c = t_ctx_stack.back();
    return (c && c->alive) ? c : nullptr;
}

bool valid_ctx_locked(Ctx* c) {
    if (!c) return false;
    if (drv().ctxs.count(c) || drv().greens.count(c)) return c->alive;
    for (auto& d : drv().devices)
        if (&d->primary == c) return c->alive;
    return false;
}

// --- device arena ---------------------------------------------------------------------------
bool arena_init(Device& d) {
    if (d.arena) return true;
    char name[32];
    snprintf(name, sizeof name, "fakecuda-dev%d", d.ordinal);
    int fd = memfd_create(name, 0);
    if (fd < 0) return false;
    if (ftruncate(fd, off_t(d.total)) != 0) {
        close(fd);
        return false;
    }
    // Reserve with 2 MiB alignment so large allocations are 2 MiB aligned in address.
    size_t span = d.total + kLargeAlign;
    void* r = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) {
        close(fd);
        return false;
    }
    uintptr_t a = (uintptr_t(r) + kLargeAlign - 1) & ~(uintptr_t(kLargeAlign) - 1);
    void* m = mmap(reinterpret_cast<void*>(a), d.total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (m == MAP_FAILED) {
        munmap(r, span);
        close(fd);
        return false;
    }
    d.arena_fd = fd;
    d.arena = static_cast<char*>(m);
    d.free_ranges.clear();
    d.free_ranges[0] = d.total;
    return true;
}

bool arena_take(Device& d, size_t len, size_t align, size_t* off_out) {
    for (auto it = d.free_ranges.begin(); it != d.free_ranges.end(); ++it) {
        size_t start = (it->first + align - 1) / align * align;
        size_t end = it->first + it->second;
        if (start + len > end) continue;
        size_t fo = it->first;
        d.free_ranges.erase(it);
        if (start > fo) d.free_ranges[fo] = start - fo;
        if (end > start + len) d.free_ranges[start + len] = end - (start + len);
        *off_out = start;
        return true;
    }
    return false;
}

void arena_give(Device& d, size_t off, size_t len) {
    // Drop the contents so freed memory costs nothing (whole pages only).
    size_t pg = size_t(sysconf(_SC_PAGESIZE));
    size_t ps = (off + pg - 1) / pg * pg, pe = (off + len) / pg * pg;
    if (pe > ps) fallocate(d.arena_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(ps), off_t(pe - ps));
    auto next = d.free_ranges.lower_bound(off);
    if (next != d.free_ranges.end() && next->first == off + len) {
        len += next->second;
        d.free_ranges.erase(next);
    }
    auto prev = d.free_ranges.lower_bound(off);
    if (prev != d.free_ranges.begin()) {
        --prev;
        if (prev->first + prev->second == off) {
            prev->second += len;
            return;
        }
    }
    d.free_ranges[off] = len;
}

CUresult alloc_linear_locked(Ctx* ctx, size_t size, Kind kind, CUdeviceptr* out) {
    Driver& D = drv();
    Device& dev = *D.devices[size_t(ctx->dev)];
    size_t align = size >= kLargeAlign ? kLargeAlign : kSmallAlign;
    size_t rounded = (size + align - 1) / align * align;
    if (rounded < size || dev.used + rounded > dev.total) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!arena_init(dev)) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t off;
    if (!arena_take(dev, rounded, align, &off)) return CUDA_ERROR_OUT_OF_MEMORY;
    dev.used += rounded;
    CUdeviceptr p = CUdeviceptr(dev.arena + off);
    D.allocs[p] = Alloc{p, size, rounded, off, ctx, kind, D.next_buffer_id++, false};
    ++D.live_allocations;
    note_usage_locked();
    *out = p;
    return CUDA_SUCCESS;
}

void free_linear_locked(std::map<CUdeviceptr, Alloc>::iterator it) {
    Driver& D = drv();
    Device& dev = *D.devices[size_t(it->second.ctx->dev)];
    arena_give(dev, it->second.arena_off, it->second.rounded);
    dev.used -= it->second.rounded;
    --D.live_allocations;
    D.allocs.erase(it);
}

// Allocation containing p (base <= p < base+size), or end().
std::map<CUdeviceptr, Alloc>::iterator find_alloc_locked(CUdeviceptr p) {
    auto& m = drv().allocs;
    auto it = m.upper_bound(p);
    if (it == m.begin()) return m.end();
    --it;
    if (p >= it->first && p < it->first + std::max<size_t>(it->second.size, 1)) return it;
    return m.end();
}

std::map<CUdeviceptr, VmMapping>::iterator find_mapping_locked(CUdeviceptr p) {
    auto& m = drv().mappings;
    auto it = m.upper_bound(p);
    if (it == m.begin()) return m.end();
    --it;
    if (p >= it->first && p < it->first + it->second.size) return it;
    return m.end();
}

std::map<CUdeviceptr, IpcImport>::iterator find_import_locked(CUdeviceptr p) {
    auto& m = drv().imports;
    auto it = m.upper_bound(p);
    if (it == m.begin()) return m.end();
    --it;
    if (p >= it->first && p < it->first + it->second.size) return it;
    return m.end();
}

// Is [p, p+n) device memory the fake knows (allocation, mapped VM range, IPC import)?
bool device_range_ok_locked(CUdeviceptr p, size_t n) {
    if (n == 0) return true;
    auto a = find_alloc_locked(p);
    if (a != drv().allocs.end()) return p + n <= a->first + a->second.rounded;
    auto i = find_import_locked(p);
    if (i != drv().imports.end()) return p + n <= i->first + i->second.size;
    // VM: consecutive mappings may cover the range
    CUdeviceptr cur = p, end = p + n;
    while (cur < end) {
        auto m = find_mapping_locked(cur);
        if (m == drv().mappings.end() || m->second.access == CU_MEM_ACCESS_FLAGS_PROT_NONE) return false;
        cur = m->first + m->second.size;
    }
    return true;
}

// --- streams ---------------------------------------------------------------------------------
std::shared_ptr<Stream> make_stream_locked(Ctx* ctx, unsigned flags, int prio, bool legacy, bool per_thread) {
    auto s = std::make_shared<Stream>();
    s->ctx = ctx;
    s->flags = flags;
    s->priority = prio;
    s->legacy = legacy;
    s->per_thread = per_thread;
    s->id = drv().next_stream_id++;
    if (!legacy) ctx->streams.insert(s.get());
    drv().streams[s.get()] = s;
    return s;
}

std::shared_ptr<Stream> legacy_stream_locked(Ctx* ctx) {
    if (!ctx->legacy) ctx->legacy = make_stream_locked(ctx, 0, 0, true, false);
    return ctx->legacy;
}

std::shared_ptr<Stream> per_thread_stream_locked(Ctx* ctx) {
    auto& s = t_pts.by_ctx[ctx];
    if (!s || !drv().streams.count(s.get())) s = make_stream_locked(ctx, 0, 0, false, true);  // new or torn down
    return s;
}

// Resolves a stream handle; `ptds` says whether handle 0 means the per-thread stream.
// Needs a current context for the special handles.
CUresult resolve_stream_locked(CUstream h, bool ptds, std::shared_ptr<Stream>* out) {
    if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        Ctx* ctx = current_ctx();
        if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
        if (h == CU_STREAM_PER_THREAD || (h == nullptr && ptds)) {
            // A green context has no per-thread stream: the driver refuses every call naming it
            // (driver 580).
            if (ctx->green_of) return CUDA_ERROR_INVALID_HANDLE;
            *out = per_thread_stream_locked(ctx);
        } else {
            *out = legacy_stream_locked(ctx);
        }
        return CUDA_SUCCESS;
    }
    auto it = drv().streams.find(reinterpret_cast<Stream*>(h));
    if (it == drv().streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (it->second->detached) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (!it->second->ctx->alive) return CUDA_ERROR_INVALID_HANDLE;
    *out = it->second;
    return CUDA_SUCCESS;
}

// Adds to `deps` what work submitted on s waits for by the legacy-stream rules: on the legacy
// stream, every blocking stream's work so far; on a blocking stream, the legacy stream's.
void legacy_rule_deps_locked(const Stream& s, std::vector<Dep>& deps) {
    Ctx* ctx = s.ctx;
    if (s.legacy) {
        for (Stream* b : ctx->streams)
            if (b->blocking() && b->submitted > 0) deps.push_back({b->shared_from_this(), b->submitted});
    } else if (s.blocking() && ctx->legacy && ctx->legacy->submitted > 0) {
        deps.push_back({ctx->legacy, ctx->legacy->submitted});
    }
}

// Submits fn on s with the legacy-stream rules; returns its sequence number (0 if captured).
uint64_t submit_locked(const std::shared_ptr<Stream>& s, std::function<void()> fn, std::vector<Dep> deps = {}) {
    if (s->capture) {
        s->capture->graph->ops.push_back(std::move(fn));
        return 0;
    }
    legacy_rule_deps_locked(*s, deps);
    Op op;
    op.seq = ++s->submitted;
    op.deps = std::move(deps);
    op.fn = std::move(fn);
    s->push(std::move(op));
    return s->submitted;
}

// Snapshot of (stream, last submitted) for every stream of ctx.
std::vector<Dep> ctx_fence_locked(Ctx* ctx) {
    std::vector<Dep> v;
    if (ctx->legacy && ctx->legacy->submitted) v.push_back({ctx->legacy, ctx->legacy->submitted});
    for (Stream* s : ctx->streams)
        if (s->submitted) v.push_back({s->shared_from_this(), s->submitted});
    std::erase_if(ctx->retired, [](const std::shared_ptr<Stream>& s) { return s->completed.load() >= s->submitted; });
    for (const auto& s : ctx->retired) v.push_back({s, s->submitted});
    for (Ctx* g : drv().greens) {
        if (g->green_of != ctx) continue;
        std::vector<Dep> more = ctx_fence_locked(g);
        v.insert(v.end(), more.begin(), more.end());
    }
    return v;
}

void wait_all(const std::vector<Dep>& v) {
    for (const Dep& d : v) wait_reached(d.s, d.seq);
}

// Whether every stream of `v` has already run what it names.
bool all_reached(const std::vector<Dep>& v) {
    return std::all_of(v.begin(), v.end(), [](const Dep& d) { return d.s->completed.load() >= d.seq; });
}

// --- capture rules ------------------------------------------------------------------------
// "Unsafe" calls (cuMemAlloc, cuMemFree, ...) are prohibited while a global-mode capture is
// active anywhere, or a thread-local one begun by this thread, unless this thread is relaxed.
// Returns true (and invalidates those captures) when prohibited.
bool unsafe_call_prohibited_locked() {
    if (t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
    bool hit = false;
    for (auto& c : drv().captures) {
        if (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
            (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && c->owner == std::this_thread::get_id())) {
            c->invalidated = true;
            hit = true;
        }
    }
    return hit;
}

// Kills a context's allocations and streams (cuCtxDestroy, cuDevicePrimaryCtxReset).
void ctx_teardown_locked(Ctx* ctx, std::unique_lock<std::mutex>& lk) {
    auto fence = ctx_fence_locked(ctx);
    lk.unlock();
    wait_all(fence);
    lk.lock();
    Driver& D = drv();
    for (auto it = D.allocs.begin(); it != D.allocs.end();) {
        auto cur = it++;
        if (cur->second.ctx == ctx) free_linear_locked(cur);
    }
    for (Stream* s : ctx->streams) {
        auto it = D.streams.find(s);
        if (it != D.streams.end()) {
            it->second->retire();
            D.streams.erase(it);
        }
    }
    ctx->streams.clear();
    ctx->retired.clear();
    if (ctx->marker) {
        ctx->marker->retire();
        ctx->marker.reset();
    }
    if (ctx->legacy) {
        D.streams.erase(ctx->legacy.get());
        ctx->legacy->retire();
        ctx->legacy.reset();
    }
}

// --- events ---------------------------------------------------------------------------------
struct Record {
    std::shared_ptr<Stream> s;
    uint64_t seq = 0;  // 0: complete at once
    std::atomic<double> t_ms{0};
    std::shared_ptr<Capture> capture;  // recorded into a capture
};

struct Event {
    unsigned flags = 0;
    std::shared_ptr<Record> rec;  // guarded by g_mu
};

std::set<Event*>& events() {
    static auto* s = new std::set<Event*>;
    return *s;
}

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// --- one-time init --------------------------------------------------------------------------
void child_after_fork() { g_forked_child.store(true); }

struct DeinitGuard {
    ~DeinitGuard() { g_deinit.store(true); }
};

void init_once() {
    static std::once_flag once;
    std::call_once(once, [] {
        Driver& D = drv();
        D.ndev = int(std::clamp<size_t>(env_size("FAKE_CUDA_DEVICES", 1), 1, 64));
        D.mem_bytes = env_size("FAKE_CUDA_MEMORY_MB", 4096) * kMiB;
        D.vm_gran = env_size("FAKE_CUDA_VM_GRANULARITY_KB", kLargeAlign / 1024) * 1024;
        for (int i = 0; i < D.ndev; ++i) {
            auto d = std::make_unique<Device>();
            d->ordinal = i;
            d->total = D.mem_bytes;
            d->vmm = !env_lacks_vmm(i);
            d->primary.dev = i;
            d->primary.primary = true;
            d->primary.alive = false;
            d->primary.id = D.next_ctx_id++;
            D.devices.push_back(std::move(d));
        }
        pthread_atfork(nullptr, nullptr, child_after_fork);
        static DeinitGuard guard;  // destroyed at exit (before earlier-loaded libraries' statics)
    });
}

CUresult check_dev(CUdevice dev) {
    return (dev >= 0 && dev < drv().ndev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// --- ipc handle layout -------------------------------------------------------------------
struct IpcPayload {
    uint32_t magic;
    int32_t pid;
    int32_t fd;
    int32_t dev;
    uint64_t arena_off;  // of the allocation base
    uint64_t size;
    uint64_t buffer_id;
};
static_assert(sizeof(IpcPayload) <= CU_IPC_HANDLE_SIZE);
constexpr uint32_t kIpcMagic = 0xFA4ECDA1;

}  // namespace

// =========================================================================================
// Exported driver API
// =========================================================================================

FK_API CUresult CUDAAPI cuInit(unsigned int Flags) {
    FK_ENTER_NOINIT();
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    init_once();
    g_initialized.store(true, std::memory_order_release);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDriverGetVersion(int* v) {
    FK_ENTER_NOINIT();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetCount(int* count) {
    FK_ENTER();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = drv().ndev;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
    FK_ENTER();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(ordinal) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
    FK_ENTER();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, size_t(len), "Fake CUDA Device %d", dev);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
    FK_ENTER();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = drv().mem_bytes;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
    FK_ENTER();
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    memcpy(uuid->bytes, "fakecuda", 8);
    uuid->bytes[15] = char(dev);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
    FK_ENTER();
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    int v = 0;
    switch (attrib) {
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
        case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
        case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
        case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
        case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
        case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
        case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x10 + dev; break;
        case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
        case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
        case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
        case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: v = 0; break;
        case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = drv().devices[size_t(dev)]->vmm; break;
        case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
        case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 50 * 1024 * 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
        case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
        default:
            if (int(attrib) <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
            v = 0;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

// --- primary contexts --------------------------------------------------------------------
FK_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
    FK_ENTER();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lk(g_mu);
    Device& d = *drv().devices[size_t(dev)];
    d.primary.alive = true;
    d.primary.flags = d.primary_flags;
    ++d.primary_refs;
    *pctx = reinterpret_cast<CUcontext>(&d.primary);
    return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev) {
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::unique_lock<std::mutex> lk(g_mu);
    Device& d = *drv().devices[size_t(dev)];
    if (d.primary_refs <= 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--d.primary_refs == 0) {
        ctx_teardown_locked(&d.primary, lk);
        d.primary.alive = false;
    }
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    FK_ENTER();
    return primary_release(dev);
}
FK_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
    FK_ENTER();
    return primary_release(dev);
}

static CUresult primary_reset(CUdevice dev) {
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::unique_lock<std::mutex> lk(g_mu);
    Device& d = *drv().devices[size_t(dev)];
    ctx_teardown_locked(&d.primary, lk);
    // The handle stays the same; it is re-initialised by the next use (like the driver,
    // the context remains current in threads that had it current, usable again).
    d.primary.flags = d.primary_flags = 0;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    FK_ENTER();
    return primary_reset(dev);
}
FK_API CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) {
    FK_ENTER();
    return primary_reset(dev);
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
    FK_ENTER();
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lk(g_mu);
    Device& d = *drv().devices[size_t(dev)];
    *flags = d.primary_flags;
    *active = d.primary_refs > 0 ? 1 : 0;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    FK_ENTER();
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (flags & ~0xFFu) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Device& d = *drv().devices[size_t(dev)];
    d.primary_flags = flags;
    d.primary.flags = flags;
    return CUDA_SUCCESS;
}

// --- contexts ------------------------------------------------------------------------------
static CUresult ctx_create(CUcontext* pctx, unsigned flags, CUdevice dev) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lk(g_mu);
    Ctx* c = new Ctx;
    c->dev = dev;
    c->flags = flags;
    c->id = drv().next_ctx_id++;
    drv().ctxs.insert(c);
    t_ctx_stack.push_back(c);  // cuCtxCreate pushes the new context
    *pctx = reinterpret_cast<CUcontext>(c);
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* /*params*/, unsigned int flags, CUdevice dev) {
    FK_ENTER();
    return ctx_create(pctx, flags, dev);
}
FK_API CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
    FK_ENTER();
    return ctx_create(pctx, flags, dev);
}

FK_API CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
    FK_ENTER();
    Ctx* c = reinterpret_cast<Ctx*>(ctx);
    std::unique_lock<std::mutex> lk(g_mu);
    if (!c || !drv().ctxs.count(c)) return CUDA_ERROR_INVALID_CONTEXT;  // primary ones too
    ctx_teardown_locked(c, lk);
    c->alive = false;
    drv().ctxs.erase(c);
    // The Ctx object is leaked so stale handles fail cleanly instead of dangling.
    auto& st = t_ctx_stack;
    st.erase(std::remove(st.begin(), st.end(), c), st.end());
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
    FK_ENTER();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_ctx_stack.empty() ? nullptr : reinterpret_cast<CUcontext>(t_ctx_stack.back());
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
    FK_ENTER();
    Ctx* c = reinterpret_cast<Ctx*>(ctx);
    if (!c) {
        if (!t_ctx_stack.empty()) t_ctx_stack.pop_back();
        return CUDA_SUCCESS;
    }
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (!valid_ctx_locked(c)) return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (t_ctx_stack.empty()) t_ctx_stack.push_back(c);
    else t_ctx_stack.back() = c;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
    FK_ENTER();
    Ctx* c = reinterpret_cast<Ctx*>(ctx);
    std::lock_guard<std::mutex> lk(g_mu);
    if (!valid_ctx_locked(c)) return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx_stack.push_back(c);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
    FK_ENTER();
    if (t_ctx_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx) *pctx = reinterpret_cast<CUcontext>(t_ctx_stack.back());
    t_ctx_stack.pop_back();
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
    FK_ENTER();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    Ctx* c = current_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *device = c->dev;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
    FK_ENTER();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    Ctx* c = ctx ? reinterpret_cast<Ctx*>(ctx) : current_ctx();
    std::lock_guard<std::mutex> lk(g_mu);
    if (!valid_ctx_locked(c)) return CUDA_ERROR_INVALID_CONTEXT;
    *device = c->dev;
    return CUDA_SUCCESS;
}

// Peer access: every pair of distinct devices may have it. Recorded per context, for the
// answers the driver gives (already enabled, not enabled); kernels check virtual memory's
// access per device instead (launch()), which this does not change, as on the GPU.
FK_API CUresult CUDAAPI cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
    FK_ENTER();
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev) || check_dev(peer)) return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
    FK_ENTER();
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    Ctx* c = current_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    Ctx* p = reinterpret_cast<Ctx*>(peer);
    if (!valid_ctx_locked(p)) return CUDA_ERROR_INVALID_CONTEXT;
    if (p->dev == c->dev) return CUDA_ERROR_INVALID_DEVICE;
    return c->peers.insert(p).second ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
}

FK_API CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peer) {
    FK_ENTER();
    Ctx* c = current_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    return c->peers.erase(reinterpret_cast<Ctx*>(peer)) != 0 ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

FK_API CUresult CUDAAPI cuCtxGetFlags(unsigned int* flags) {
    FK_ENTER();
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    Ctx* c = current_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
    FK_ENTER();
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    (void)ctx;
    *version = 3020;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    FK_ENTER();
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return CUDA_SUCCESS;
}

static CUresult ctx_sync(Ctx* c) {
    std::vector<Dep> fence;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (!valid_ctx_locked(c)) return CUDA_ERROR_INVALID_CONTEXT;
        fence = ctx_fence_locked(c);
        // Events cuCtxRecordEvent queued are done too once the context is synchronized, as
        // every earlier task is on a GPU.
        if (c->marker && c->marker->submitted) fence.push_back({c->marker, c->marker->submitted});
    }
    wait_all(fence);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxSynchronize(void) {
    FK_ENTER();
    return ctx_sync(current_ctx());
}
FK_API CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
    FK_ENTER();
    return ctx_sync(ctx ? reinterpret_cast<Ctx*>(ctx) : current_ctx());
}

// --- errors ------------------------------------------------------------------------------
namespace {
struct ErrName {
    CUresult code;
    const char* name;
    const char* text;
};
const ErrName kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempted to end a capture sequence from a different thread"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "context already in use"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
}  // namespace

FK_API CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& e : kErrors)
        if (e.code == error) {
            *pStr = e.name;
            return CUDA_SUCCESS;
        }
    *pStr = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

FK_API CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& e : kErrors)
        if (e.code == error) {
            *pStr = e.text;
            return CUDA_SUCCESS;
        }
    *pStr = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

// --- linear memory -------------------------------------------------------------------------
FK_API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
    FK_ENTER();
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    Ctx* ctx = current_ctx();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    if (unsafe_call_prohibited_locked()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    return alloc_linear_locked(ctx->green_of ? ctx->green_of : ctx, bytesize, Kind::Linear, dptr);
}

FK_API CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
    (void)dptr, (void)bytesize;
    return CUDA_ERROR_NOT_SUPPORTED;  // 32-bit device pointers: not on 64-bit platforms
}

FK_API CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int elem) {
    FK_ENTER();
    if (!dptr || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    Ctx* ctx = current_ctx();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    size_t p = (width + 511) / 512 * 512;
    std::lock_guard<std::mutex> lk(g_mu);
    if (unsafe_call_prohibited_locked()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CUresult r = alloc_linear_locked(ctx, p * height, Kind::Pitch, dptr);
    if (r == CUDA_SUCCESS) *pitch = p;
    return r;
}

FK_API CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
    FK_ENTER();
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) return CUDA_ERROR_INVALID_VALUE;
    Ctx* ctx = current_ctx();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    if (unsafe_call_prohibited_locked()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return alloc_linear_locked(ctx, bytesize, Kind::Managed, dptr);
}

FK_API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
    FK_ENTER();
    if (dptr == 0) return CUDA_SUCCESS;
    Ctx* ctx = current_ctx();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    std::unique_lock<std::mutex> lk(g_mu);
    if (unsafe_call_prohibited_locked()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    auto it = drv().allocs.find(dptr);
    if (it == drv().allocs.end() || it->second.free_pending) return CUDA_ERROR_INVALID_VALUE;
    if (it->second.kind != Kind::Async) {
        // Like the driver: wait until all work of the allocation's context is done.
        auto fence = ctx_fence_locked(it->second.ctx);
        it->second.free_pending = true;  // a concurrent second free fails
        lk.unlock();
        wait_all(fence);
        lk.lock();
        it = drv().allocs.find(dptr);
        if (it == drv().allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    }
    free_linear_locked(it);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr) {
    FK_ENTER();
    return dptr == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

FK_API CUresult CUDAAPI cuMemGetInfo_v2(size_t* free_b, size_t* total) {
    FK_ENTER();
    Ctx* ctx = current_ctx();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    Device& d = *drv().devices[size_t(ctx->dev)];
    if (free_b) *free_b = d.total - d.used;
    if (total) *total = d.total;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
    FK_ENTER();
    if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    auto a = find_alloc_locked(dptr);
    if (a != drv().allocs.end()) {
        if (pbase) *pbase = a->first;
        if (psize) *psize = a->second.size;
        return CUDA_SUCCESS;
    }
    auto m = find_mapping_locked(dptr);
    if (m != drv().mappings.end()) {
        if (pbase) *pbase = m->first;
        if (psize) *psize = m->second.size;
        return CUDA_SUCCESS;
    }
    auto i = find_import_locked(dptr);
    if (i != drv().imports.end()) {
        if (pbase) *pbase = i->first;
        if (psize) *psize = i->second.size;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_NOT_FOUND;
}

namespace {
// Page-locked host memory: plain host memory here, its flags kept for cuMemHostGetFlags. Under
// unified addressing its device pointer is its host address.
CUresult host_alloc(void** pp, size_t bytesize, unsigned flags) {
    if (!pp || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~unsigned(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> lk(g_mu);
    drv().host_allocs[p] = Driver::HostAlloc{bytesize, flags};
    drv().host_bytes += bytesize;
    *pp = p;
    return CUDA_SUCCESS;
}

// The pinned allocation containing p.
std::map<void*, Driver::HostAlloc>::iterator find_host_locked(const void* p) {
    auto& m = drv().host_allocs;
    auto h = m.upper_bound(const_cast<void*>(p));
    if (h == m.begin()) return m.end();
    --h;
    const char* base = static_cast<const char*>(h->first);
    return static_cast<const char*>(p) < base + h->second.size ? h : m.end();
}
}  // namespace

FK_API CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
    FK_ENTER();
    return host_alloc(pp, bytesize, flags);
}

FK_API CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
    FK_ENTER();
    return host_alloc(pp, bytesize, 0);
}

FK_API CUresult CUDAAPI cuMemFreeHost(void* p) {
    FK_ENTER();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = drv().host_allocs.find(p);
    if (it == drv().host_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    drv().host_bytes -= it->second.size;
    drv().host_allocs.erase(it);
    free(p);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemHostGetFlags(unsigned int* flags, void* p) {
    FK_ENTER();
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = find_host_locked(p);
    if (it == drv().host_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    *flags = it->second.flags;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned int flags) {
    FK_ENTER();
    if (!dptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    if (find_host_locked(p) == drv().host_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    *dptr = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
}

// --- pointer attributes ----------------------------------------------------------------------
namespace {
// Writes one attribute; returns CUDA_ERROR_INVALID_VALUE for pointers it does not know
// (cuPointerGetAttributes then writes zeros instead).
CUresult pointer_attr_locked(CUpointer_attribute a, void* data, CUdeviceptr p, bool* known) {
    Driver& D = drv();
    CUmemorytype type = CUmemorytype(0);
    Ctx* ctx = nullptr;
    int dev = 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    uint64_t buffer_id = 0;
    bool managed = false;
    bool ipc_ok = false;
    unsigned long long access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    *known = true;
    if (auto it = find_alloc_locked(p); it != D.allocs.end()) {
        type = it->second.kind == Kind::Managed ? CU_MEMORYTYPE_UNIFIED : CU_MEMORYTYPE_DEVICE;
        ctx = it->second.ctx;
        dev = ctx->dev;
        base = it->first;
        size = it->second.size;
        buffer_id = it->second.buffer_id;
        managed = it->second.kind == Kind::Managed;
        ipc_ok = it->second.kind == Kind::Linear || it->second.kind == Kind::Pitch;
    } else if (auto m = find_mapping_locked(p); m != D.mappings.end()) {
        type = CU_MEMORYTYPE_DEVICE;
        dev = m->second.handle->dev;
        base = m->first;
        size = m->second.size;
        buffer_id = m->second.buffer_id;
        access = m->second.access;
    } else if (auto i = find_import_locked(p); i != D.imports.end()) {
        type = CU_MEMORYTYPE_DEVICE;
        ctx = current_ctx();
        dev = ctx ? ctx->dev : 0;
        base = i->first;
        size = i->second.size;
        buffer_id = i->first;
    } else {
        bool host = false;
        auto h = find_host_locked(reinterpret_cast<void*>(p));
        if (h != D.host_allocs.end()) {
            host = true;
            type = CU_MEMORYTYPE_HOST;
            ctx = current_ctx();
            dev = ctx ? ctx->dev : 0;
            base = CUdeviceptr(h->first);
            size = h->second.size;
            buffer_id = base;
        }
        if (!host) {
            *known = false;
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    switch (a) {
        case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(ctx); break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned int*>(data) = type; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data) = p; break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            if (type == CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
            *static_cast<void**>(data) = reinterpret_cast<void*>(p);
            break;
        case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *static_cast<bool*>(data) = false; break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID: *static_cast<unsigned long long*>(data) = buffer_id; break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<bool*>(data) = managed; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = dev; break;
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *static_cast<bool*>(data) = ipc_ok; break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = base; break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = size; break;
        case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<bool*>(data) = true; break;
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *static_cast<unsigned long long*>(data) = 0; break;
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: *static_cast<unsigned long long*>(data) = access; break;
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *static_cast<CUmemoryPool*>(data) = nullptr; break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
}  // namespace

FK_API CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    FK_ENTER();
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    bool known;
    return pointer_attr_locked(attribute, data, ptr, &known);
}

FK_API CUresult CUDAAPI cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
    FK_ENTER();
    if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    for (unsigned i = 0; i < n; ++i) {
        if (!data[i]) continue;
        bool known;
        CUresult r = pointer_attr_locked(attrs[i], data[i], ptr, &known);
        if (r != CUDA_SUCCESS) {
            if (known && attrs[i] != CU_POINTER_ATTRIBUTE_HOST_POINTER) return r;
            // Unknown pointer (or no host pointer): the driver reports zeros.
            size_t sz = 0;
            switch (attrs[i]) {
                case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: sz = 4; break;
                case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: case CU_POINTER_ATTRIBUTE_IS_MANAGED:
                case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: case CU_POINTER_ATTRIBUTE_MAPPED: sz = 1; break;
                default: sz = 8;
            }
            if (attrs[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) *static_cast<int*>(data[i]) = -2;
            else memset(data[i], 0, sz);
        }
    }
    return CUDA_SUCCESS;
}

// --- stream-ordered allocation ----------------------------------------------------------------
static CUresult alloc_async(CUdeviceptr* dptr, size_t size, CUstream h, bool ptds) {
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    if (s->capture && s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CUresult r = alloc_linear_locked(s->ctx, size, Kind::Async, dptr);
    if (r == CUDA_SUCCESS && s->capture) ++s->capture->graph->alloc_nodes;  // a graph alloc node
    return r;
}

FK_API CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t size, CUstream h) {
    FK_ENTER();
    return alloc_async(dptr, size, h, false);
}
FK_API CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t size, CUstream h) {
    FK_ENTER();
    return alloc_async(dptr, size, h, true);
}
FK_API CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream h) {
    FK_ENTER();
    (void)pool;
    return alloc_async(dptr, size, h, false);
}
FK_API CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream h) {
    FK_ENTER();
    (void)pool;
    return alloc_async(dptr, size, h, true);
}

static CUresult free_async(CUdeviceptr p, CUstream h, bool ptds) {
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    auto it = drv().allocs.find(p);
    if (it == drv().allocs.end() || it->second.free_pending) return CUDA_ERROR_INVALID_VALUE;
    if (s->capture && s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    it->second.free_pending = true;
    if (s->capture) {  // a graph free node: the memory is released when the graph is destroyed
        s->capture->graph->freed_in_graph.push_back(p);
        return CUDA_SUCCESS;
    }
    submit_locked(s, [p] {
        std::lock_guard<std::mutex> lk2(g_mu);
        auto it2 = drv().allocs.find(p);
        if (it2 != drv().allocs.end()) free_linear_locked(it2);
    });
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr p, CUstream h) {
    FK_ENTER();
    return free_async(p, h, false);
}
FK_API CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream h) {
    FK_ENTER();
    return free_async(p, h, true);
}

// --- copies and sets ---------------------------------------------------------------------
namespace {
enum class Chk { None, Dst, Src, Both };

// Enqueues fn on the stream; sync=true waits for it (synchronous API semantics).
CUresult do_copy(CUstream h, bool ptds, bool sync, CUdeviceptr dst, CUdeviceptr src, size_t n, Chk chk,
                 std::function<void()> fn) {
    std::shared_ptr<Stream> s;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
        if ((chk == Chk::Dst || chk == Chk::Both) && !device_range_ok_locked(dst, n)) return CUDA_ERROR_INVALID_VALUE;
        if ((chk == Chk::Src || chk == Chk::Both) && !device_range_ok_locked(src, n)) return CUDA_ERROR_INVALID_VALUE;
        if (s->capture) {
            if (sync) {  // synchronous calls cannot be captured
                s->capture->invalidated = true;
                return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
            }
            if (s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        }
        if (sync && unsafe_call_prohibited_locked()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        seq = submit_locked(s, std::move(fn));
    }
    if (sync && seq) wait_reached(s, seq);
    return CUDA_SUCCESS;
}

CUresult htod(CUdeviceptr dst, const void* src, size_t n, CUstream h, bool ptds, bool sync) {
    return do_copy(h, ptds, sync, dst, 0, n, Chk::Dst, [=] { memcpy(reinterpret_cast<void*>(dst), src, n); });
}
CUresult dtoh(void* dst, CUdeviceptr src, size_t n, CUstream h, bool ptds, bool sync) {
    return do_copy(h, ptds, sync, 0, src, n, Chk::Src, [=] { memcpy(dst, reinterpret_cast<const void*>(src), n); });
}
CUresult dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, bool ptds, bool sync) {
    return do_copy(h, ptds, sync, dst, src, n, Chk::Both,
                   [=] { memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); });
}
CUresult anycopy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, bool ptds, bool sync) {
    return do_copy(h, ptds, sync, dst, src, n, Chk::None,
                   [=] { memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); });
}
CUresult set8(CUdeviceptr dst, unsigned char v, size_t n, CUstream h, bool ptds, bool sync) {
    return do_copy(h, ptds, sync, dst, 0, n, Chk::Dst, [=] { memset(reinterpret_cast<void*>(dst), v, n); });
}
CUresult set16(CUdeviceptr dst, unsigned short v, size_t n, CUstream h, bool ptds, bool sync) {
    if (dst % 2) return CUDA_ERROR_INVALID_VALUE;
    return do_copy(h, ptds, sync, dst, 0, n * 2, Chk::Dst, [=] {
        auto* p = reinterpret_cast<unsigned short*>(dst);
        for (size_t i = 0; i < n; ++i) p[i] = v;
    });
}
CUresult set32(CUdeviceptr dst, unsigned int v, size_t n, CUstream h, bool ptds, bool sync) {
    if (dst % 4) return CUDA_ERROR_INVALID_VALUE;
    return do_copy(h, ptds, sync, dst, 0, n * 4, Chk::Dst, [=] {
        auto* p = reinterpret_cast<unsigned int*>(dst);
        for (size_t i = 0; i < n; ++i) p[i] = v;
    });
}
}  // namespace

#define FK_SYNC_VARIANTS(api, impl, params, args)                                              \
    FK_API CUresult CUDAAPI api params { FK_ENTER(); return impl(args, nullptr, false, true); } \
    FK_API CUresult CUDAAPI api##_ptds params { FK_ENTER(); return impl(args, nullptr, true, true); }
#define FK_ASYNC_VARIANTS(api, impl, params, args)                                           \
    FK_API CUresult CUDAAPI api params { FK_ENTER(); return impl(args, hStream, false, false); } \
    FK_API CUresult CUDAAPI api##_ptsz params { FK_ENTER(); return impl(args, hStream, true, false); }
#define FK_ARGS(...) __VA_ARGS__

FK_SYNC_VARIANTS(cuMemcpyHtoD_v2, htod, (CUdeviceptr dst, const void* src, size_t n), FK_ARGS(dst, src, n))
FK_SYNC_VARIANTS(cuMemcpyDtoH_v2, dtoh, (void* dst, CUdeviceptr src, size_t n), FK_ARGS(dst, src, n))
FK_SYNC_VARIANTS(cuMemcpyDtoD_v2, dtod, (CUdeviceptr dst, CUdeviceptr src, size_t n), FK_ARGS(dst, src, n))
FK_SYNC_VARIANTS(cuMemcpy, anycopy, (CUdeviceptr dst, CUdeviceptr src, size_t n), FK_ARGS(dst, src, n))
FK_SYNC_VARIANTS(cuMemsetD8_v2, set8, (CUdeviceptr dst, unsigned char v, size_t n), FK_ARGS(dst, v, n))
FK_SYNC_VARIANTS(cuMemsetD16_v2, set16, (CUdeviceptr dst, unsigned short v, size_t n), FK_ARGS(dst, v, n))
FK_SYNC_VARIANTS(cuMemsetD32_v2, set32, (CUdeviceptr dst, unsigned int v, size_t n), FK_ARGS(dst, v, n))
FK_ASYNC_VARIANTS(cuMemcpyHtoDAsync_v2, htod, (CUdeviceptr dst, const void* src, size_t n, CUstream hStream), FK_ARGS(dst, src, n))
FK_ASYNC_VARIANTS(cuMemcpyDtoHAsync_v2, dtoh, (void* dst, CUdeviceptr src, size_t n, CUstream hStream), FK_ARGS(dst, src, n))
FK_ASYNC_VARIANTS(cuMemcpyDtoDAsync_v2, dtod, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hStream), FK_ARGS(dst, src, n))
FK_ASYNC_VARIANTS(cuMemcpyAsync, anycopy, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hStream), FK_ARGS(dst, src, n))
FK_ASYNC_VARIANTS(cuMemsetD8Async, set8, (CUdeviceptr dst, unsigned char v, size_t n, CUstream hStream), FK_ARGS(dst, v, n))
FK_ASYNC_VARIANTS(cuMemsetD16Async, set16, (CUdeviceptr dst, unsigned short v, size_t n, CUstream hStream), FK_ARGS(dst, v, n))
FK_ASYNC_VARIANTS(cuMemsetD32Async, set32, (CUdeviceptr dst, unsigned int v, size_t n, CUstream hStream), FK_ARGS(dst, v, n))

// --- streams -------------------------------------------------------------------------------
static CUresult stream_create(CUstream* ph, unsigned flags, int prio) {
    if (!ph || (flags & ~unsigned(CU_STREAM_NON_BLOCKING))) return CUDA_ERROR_INVALID_VALUE;
    Ctx* ctx = current_ctx();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    auto s = make_stream_locked(ctx, flags, std::clamp(prio, -5, 0), false, false);
    *ph = reinterpret_cast<CUstream>(s.get());
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuStreamCreate(CUstream* ph, unsigned int flags) {
    FK_ENTER();
    return stream_create(ph, flags, 0);
}
FK_API CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* ph, unsigned int flags, int priority) {
    FK_ENTER();
    return stream_create(ph, flags, priority);
}

// --- green contexts: a context of their own (streams, a legacy stream) over the primary
// context's memory. Resources are not modelled: the descriptor is ignored.
FK_API CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx* ph, CUdevResourceDesc, CUdevice dev, unsigned int) {
    FK_ENTER();
    if (!ph) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lk(g_mu);
    Device& d = *drv().devices[size_t(dev)];
    Ctx* c = new Ctx;
    c->dev = dev;
    c->id = drv().next_ctx_id++;
    c->green_of = &d.primary;
    d.primary_refs++;  // the driver retains the primary context for it
    d.primary.alive = true;
    drv().greens.insert(c);
    *ph = reinterpret_cast<CUgreenCtx>(c);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxFromGreenCtx(CUcontext* pctx, CUgreenCtx h) {
    FK_ENTER();
    Ctx* c = reinterpret_cast<Ctx*>(h);
    std::lock_guard<std::mutex> lk(g_mu);
    if (!pctx || !drv().greens.count(c)) return CUDA_ERROR_INVALID_VALUE;
    *pctx = reinterpret_cast<CUcontext>(c);  // the same handle, as the driver gives
    return CUDA_SUCCESS;
}

// As CUDA 13's cuda.h says: the green context's streams that the program created are not
// destroyed; every later call on them, cuStreamDestroy included, fails with
// CUDA_ERROR_CONTEXT_IS_DESTROYED (CUDA 12: CUDA_ERROR_STREAM_DETACHED, destroy allowed), and
// their captures are invalidated. Their queued work is not waited for: it still runs, and no
// context's synchronization waits for it any more. Its legacy stream goes with it, once its
// work is done (it has no per-thread stream). Its allocations are the primary context's: none
// go.
FK_API CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx h) {
    FK_ENTER();
    Ctx* c = reinterpret_cast<Ctx*>(h);
    std::unique_lock<std::mutex> lk(g_mu);
    if (!drv().greens.count(c)) return CUDA_ERROR_INVALID_CONTEXT;
    std::vector<Dep> fence;
    if (c->legacy && c->legacy->submitted) fence.push_back({c->legacy, c->legacy->submitted});
    lk.unlock();
    wait_all(fence);
    lk.lock();
    Driver& D = drv();
    if (!D.greens.count(c)) return CUDA_ERROR_INVALID_CONTEXT;  // destroyed meanwhile
    for (Stream* s : c->streams) {
        auto it = D.streams.find(s);
        if (it == D.streams.end()) continue;
        s->detached = true;
        if (!s->capture) continue;
        s->capture->invalidated = true;
        // Begun on this stream, the capture can never be ended now: it is over.
        if (std::shared_ptr<Capture> cap = s->capture; cap->origin == s) {
            for (auto& [p, st] : D.streams)
                if (st->capture == cap) st->capture.reset();
            D.captures.erase(cap);
            D.graphs.erase(cap->graph);
            delete cap->graph;
        }
    }
    c->streams.clear();
    c->retired.clear();  // destroyed streams: their workers drain what is queued
    if (c->legacy) {
        D.streams.erase(c->legacy.get());
        c->legacy->retire();
        c->legacy.reset();
    }
    if (c->marker) {
        c->marker->retire();
        c->marker.reset();
    }
    c->alive = false;
    drv().greens.erase(c);
    auto& st = t_ctx_stack;
    st.erase(std::remove(st.begin(), st.end(), c), st.end());
    lk.unlock();
    return primary_release(c->dev);  // the Ctx is leaked, as cuCtxDestroy's
}

// A stream of the green context (the driver requires CU_STREAM_NON_BLOCKING here); with no
// green context, one of the calling thread's current context.
FK_API CUresult CUDAAPI cuGreenCtxStreamCreate(CUstream* ph, CUgreenCtx h, unsigned int flags, int priority) {
    FK_ENTER();
    if (flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    if (!h) return stream_create(ph, flags, priority);
    Ctx* c = reinterpret_cast<Ctx*>(h);
    std::lock_guard<std::mutex> lk(g_mu);
    if (!ph || !drv().greens.count(c)) return CUDA_ERROR_INVALID_VALUE;
    auto s = make_stream_locked(c, flags, std::clamp(priority, -5, 0), false, false);
    *ph = reinterpret_cast<CUstream>(s.get());
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuStreamDestroy_v2(CUstream h) {
    FK_ENTER();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = drv().streams.find(reinterpret_cast<Stream*>(h));
    if (!h || it == drv().streams.end() || it->second->legacy || it->second->per_thread) return CUDA_ERROR_INVALID_HANDLE;
    if (it->second->detached) return CUDA_ERROR_CONTEXT_IS_DESTROYED;  // cuGreenCtxDestroy
    auto s = it->second;
    s->ctx->streams.erase(s.get());
    if (s->completed.load() < s->submitted) s->ctx->retired.push_back(s);
    drv().streams.erase(it);
    s->retire();  // queued work still completes (the worker drains, then exits)
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamDestroy(CUstream h) {  // counted as cuStreamDestroy_v2
    return cuStreamDestroy_v2(h);
}

static CUresult stream_sync(CUstream h, bool ptds) {
    std::shared_ptr<Stream> s;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
        if (s->capture) {
            s->capture->invalidated = true;
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        seq = s->submitted;
    }
    wait_reached(s, seq);
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamSynchronize(CUstream h) {
    FK_ENTER();
    return stream_sync(h, false);
}
FK_API CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream h) {
    FK_ENTER();
    return stream_sync(h, true);
}

static CUresult stream_query(CUstream h, bool ptds) {
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    if (s->capture) {
        s->capture->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return s->completed.load() >= s->submitted ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FK_API CUresult CUDAAPI cuStreamQuery(CUstream h) {
    FK_ENTER();
    return stream_query(h, false);
}
FK_API CUresult CUDAAPI cuStreamQuery_ptsz(CUstream h) {
    FK_ENTER();
    return stream_query(h, true);
}

static CUresult stream_get_flags(CUstream h, unsigned* flags, bool ptds) {
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    *flags = s->flags;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamGetFlags(CUstream h, unsigned int* flags) {
    FK_ENTER();
    return stream_get_flags(h, flags, false);
}
FK_API CUresult CUDAAPI cuStreamGetFlags_ptsz(CUstream h, unsigned int* flags) {
    FK_ENTER();
    return stream_get_flags(h, flags, true);
}

static CUresult stream_get_prio(CUstream h, int* prio, bool ptds) {
    if (!prio) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    *prio = s->priority;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamGetPriority(CUstream h, int* prio) {
    FK_ENTER();
    return stream_get_prio(h, prio, false);
}
FK_API CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream h, int* prio) {
    FK_ENTER();
    return stream_get_prio(h, prio, true);
}

static CUresult stream_get_id(CUstream h, unsigned long long* id, bool ptds) {
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    *id = s->id;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamGetId(CUstream h, unsigned long long* id) {
    FK_ENTER();
    return stream_get_id(h, id, false);
}
FK_API CUresult CUDAAPI cuStreamGetId_ptsz(CUstream h, unsigned long long* id) {
    FK_ENTER();
    return stream_get_id(h, id, true);
}

static CUresult stream_get_ctx(CUstream h, CUcontext* pctx, bool ptds) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    *pctx = reinterpret_cast<CUcontext>(s->ctx);
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamGetCtx(CUstream h, CUcontext* pctx) {
    FK_ENTER();
    return stream_get_ctx(h, pctx, false);
}
FK_API CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream h, CUcontext* pctx) {
    FK_ENTER();
    return stream_get_ctx(h, pctx, true);
}
FK_API CUresult CUDAAPI cuStreamGetCtx_v2(CUstream h, CUcontext* pctx, CUgreenCtx* green) {
    FK_ENTER();
    if (green) *green = nullptr;
    return stream_get_ctx(h, pctx, false);
}
FK_API CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext* pctx, CUgreenCtx* green) {
    FK_ENTER();
    if (green) *green = nullptr;
    return stream_get_ctx(h, pctx, true);
}

static CUresult stream_get_device(CUstream h, CUdevice* dev, bool ptds) {
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    *dev = s->ctx->dev;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamGetDevice(CUstream h, CUdevice* dev) {
    FK_ENTER();
    return stream_get_device(h, dev, false);
}
FK_API CUresult CUDAAPI cuStreamGetDevice_ptsz(CUstream h, CUdevice* dev) {
    FK_ENTER();
    return stream_get_device(h, dev, true);
}

static CUresult host_fn(CUstream h, bool ptds, std::function<void()> fn) {
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    if (s->capture && s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    submit_locked(s, std::move(fn));
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuLaunchHostFunc(CUstream h, CUhostFn fn, void* user) {
    FK_ENTER();
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    return host_fn(h, false, [fn, user] { fn(user); });
}
FK_API CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void* user) {
    FK_ENTER();
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    return host_fn(h, true, [fn, user] { fn(user); });
}
FK_API CUresult CUDAAPI cuStreamAddCallback(CUstream h, CUstreamCallback cb, void* user, unsigned int flags) {
    FK_ENTER();
    if (!cb || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return host_fn(h, false, [cb, user, h] { cb(h, CUDA_SUCCESS, user); });
}
FK_API CUresult CUDAAPI cuStreamAddCallback_ptsz(CUstream h, CUstreamCallback cb, void* user, unsigned int flags) {
    FK_ENTER();
    if (!cb || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return host_fn(h, true, [cb, user, h] { cb(h, CUDA_SUCCESS, user); });
}

// --- events ------------------------------------------------------------------------------------
FK_API CUresult CUDAAPI cuEventCreate(CUevent* ph, unsigned int flags) {
    FK_ENTER();
    if (!ph || (flags & ~unsigned(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS))) return CUDA_ERROR_INVALID_VALUE;
    if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    Event* e = new Event;
    e->flags = flags;
    events().insert(e);
    *ph = reinterpret_cast<CUevent>(e);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuEventDestroy_v2(CUevent h) {
    FK_ENTER();
    std::lock_guard<std::mutex> lk(g_mu);
    Event* e = reinterpret_cast<Event*>(h);
    if (!events().erase(e)) return CUDA_ERROR_INVALID_HANDLE;
    delete e;  // pending records are shared_ptrs and stay valid
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuEventDestroy(CUevent h) {  // counted as cuEventDestroy_v2
    return cuEventDestroy_v2(h);
}

// True when a record on s would wait for nothing: s and every stream the legacy-stream rules
// would make it wait for have finished all they were given.
static bool idle_for_record_locked(const Stream& s) {
    if (s.completed.load() < s.submitted) return false;
    std::vector<Dep> deps;
    legacy_rule_deps_locked(s, deps);
    return all_reached(deps);
}

static CUresult event_record(CUevent h, CUstream hs, bool ptds) {
    std::lock_guard<std::mutex> lk(g_mu);
    Event* e = reinterpret_cast<Event*>(h);
    if (!events().count(e)) return CUDA_ERROR_INVALID_HANDLE;
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(hs, ptds, &s)) return r;
    auto rec = std::make_shared<Record>();
    rec->s = s;
    if (s->capture) {
        if (s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        rec->capture = s->capture;  // an event record node: nothing runs now
        e->rec = rec;
        return CUDA_SUCCESS;
    }
    if (idle_for_record_locked(*s)) {
        // Nothing it would wait for is pending: complete now, as a GPU's idle stream does within
        // microseconds (a worker round trip here would make every fence of an idle program late).
        rec->seq = s->submitted;
        rec->t_ms.store(now_ms());
        e->rec = rec;
        return CUDA_SUCCESS;
    }
    // The queued op owns the record: the event may be recorded again or destroyed before the
    // stream reaches it (the driver allows both), and the op must not write into freed memory.
    rec->seq = submit_locked(s, [rec] { rec->t_ms.store(now_ms()); });
    e->rec = rec;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuEventRecord(CUevent h, CUstream s) {
    FK_ENTER();
    return event_record(h, s, false);
}
FK_API CUresult CUDAAPI cuEventRecord_ptsz(CUevent h, CUstream s) {
    FK_ENTER();
    return event_record(h, s, true);
}
FK_API CUresult CUDAAPI cuEventRecordWithFlags(CUevent h, CUstream s, unsigned int flags) {
    FK_ENTER();
    if (flags & ~unsigned(CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
    return event_record(h, s, false);
}
FK_API CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent h, CUstream s, unsigned int flags) {
    FK_ENTER();
    if (flags & ~unsigned(CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
    return event_record(h, s, true);
}

// One event for all the work queued so far in a context, whatever its stream, destroyed
// streams' included, and for a primary context its green contexts' too; a capture on any of
// its streams makes it fail and is invalidated (what the driver does: tests/gpu/ctx_event_probe,
// driver 580). $FAKE_CUDA_NO_CTX_EVENTS=1: refused, as by a driver before 12.5.
FK_API CUresult CUDAAPI cuCtxRecordEvent(CUcontext hctx, CUevent h) {
    FK_ENTER();
    if (env_size("FAKE_CUDA_NO_CTX_EVENTS", 0) != 0) return CUDA_ERROR_NOT_SUPPORTED;
    std::lock_guard<std::mutex> lk(g_mu);
    Ctx* ctx = reinterpret_cast<Ctx*>(hctx);
    if (!valid_ctx_locked(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    Event* e = reinterpret_cast<Event*>(h);
    if (!events().count(e)) return CUDA_ERROR_INVALID_HANDLE;
    bool capturing = false;
    for (auto& c : drv().captures) {
        if (c->origin->ctx == ctx || c->origin->ctx->green_of == ctx) {
            c->invalidated = true;
            capturing = true;
        }
    }
    if (capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    std::vector<Dep> deps = ctx_fence_locked(ctx);
    if (!ctx->marker) {
        ctx->marker = std::make_shared<Stream>();
        ctx->marker->ctx = ctx;
        ctx->marker->flags = CU_STREAM_NON_BLOCKING;
        ctx->marker->id = drv().next_stream_id++;
    }
    auto rec = std::make_shared<Record>();
    rec->s = ctx->marker;
    if (all_reached(deps) && ctx->marker->completed.load() >= ctx->marker->submitted) {
        rec->seq = ctx->marker->submitted;  // nothing to wait for: done now, as event_record's idle case
        rec->t_ms.store(now_ms());
    } else {
        rec->seq = submit_locked(ctx->marker, [rec] { rec->t_ms.store(now_ms()); }, std::move(deps));
    }
    e->rec = rec;
    return CUDA_SUCCESS;
}

// Looks the event up; for events recorded in a live capture returns CAPTURE_UNSUPPORTED
// (and invalidates that capture).
static CUresult event_get(CUevent h, std::shared_ptr<Record>* out) {
    Event* e = reinterpret_cast<Event*>(h);
    if (!events().count(e)) return CUDA_ERROR_INVALID_HANDLE;
    *out = e->rec;
    if (*out && (*out)->capture) {
        if (drv().captures.count((*out)->capture)) {
            (*out)->capture->invalidated = true;
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        out->reset();  // a node of a finished capture: counts as complete
    }
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuEventQuery(CUevent h) {
    FK_ENTER();
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Record> rec;
    if (CUresult r = event_get(h, &rec)) return r;
    if (!rec) return CUDA_SUCCESS;
    return rec->s->completed.load() >= rec->seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FK_API CUresult CUDAAPI cuEventSynchronize(CUevent h) {
    FK_ENTER();
    std::shared_ptr<Record> rec;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (CUresult r = event_get(h, &rec)) return r;
    }
    if (rec) wait_reached(rec->s, rec->seq);
    return CUDA_SUCCESS;
}

static CUresult elapsed(float* ms, CUevent a, CUevent b) {
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Event* ea = reinterpret_cast<Event*>(a);
    Event* eb = reinterpret_cast<Event*>(b);
    if (!events().count(ea) || !events().count(eb)) return CUDA_ERROR_INVALID_HANDLE;
    if ((ea->flags | eb->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    if (!ea->rec || !eb->rec || ea->rec->capture || eb->rec->capture) return CUDA_ERROR_INVALID_HANDLE;
    if (ea->rec->s->completed.load() < ea->rec->seq || eb->rec->s->completed.load() < eb->rec->seq) return CUDA_ERROR_NOT_READY;
    *ms = float(eb->rec->t_ms.load() - ea->rec->t_ms.load());
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
    FK_ENTER();
    return elapsed(ms, a, b);
}
FK_API CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
    FK_ENTER();
    return elapsed(ms, a, b);
}

static CUresult stream_wait_event(CUstream hs, CUevent he, unsigned flags, bool ptds) {
    if (flags & ~unsigned(CU_EVENT_WAIT_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Event* e = reinterpret_cast<Event*>(he);
    if (!events().count(e)) return CUDA_ERROR_INVALID_HANDLE;
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(hs, ptds, &s)) return r;
    auto rec = e->rec;
    if (rec && rec->capture) {
        if (drv().captures.count(rec->capture) && !s->capture) s->capture = rec->capture;  // joins the capture
        return CUDA_SUCCESS;
    }
    if (s->capture) return CUDA_SUCCESS;  // dependency on outside work: nothing to record
    if (!rec || rec->seq == 0) return CUDA_SUCCESS;
    submit_locked(s, nullptr, {Dep{rec->s, rec->seq}});
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamWaitEvent(CUstream hs, CUevent he, unsigned int flags) {
    FK_ENTER();
    return stream_wait_event(hs, he, flags, false);
}
FK_API CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hs, CUevent he, unsigned int flags) {
    FK_ENTER();
    return stream_wait_event(hs, he, flags, true);
}

// --- stream capture and graphs -----------------------------------------------------------------
static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool ptds) {
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->capture) return CUDA_ERROR_ILLEGAL_STATE;
    auto c = std::make_shared<Capture>();
    c->id = drv().next_capture_id++;
    c->mode = mode;
    c->owner = std::this_thread::get_id();
    c->graph = new Graph;
    c->origin = s.get();
    drv().graphs.insert(c->graph);
    drv().captures.insert(c);
    s->capture = c;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) {
    FK_ENTER();
    return begin_capture(h, mode, false);
}
FK_API CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode) {
    FK_ENTER();
    return begin_capture(h, mode, true);
}
FK_API CUresult CUDAAPI cuStreamBeginCapture(CUstream h) {
    FK_ENTER();
    return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}
FK_API CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream h) {
    FK_ENTER();
    return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}

static CUresult end_capture(CUstream h, CUgraph* out, bool ptds) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    auto c = s->capture;
    if (!c || c->origin != s.get()) return CUDA_ERROR_ILLEGAL_STATE;
    if (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && c->owner != std::this_thread::get_id())
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    for (auto& [p, st] : drv().streams)
        if (st->capture == c) st->capture.reset();
    drv().captures.erase(c);
    if (c->invalidated) {
        drv().graphs.erase(c->graph);
        delete c->graph;
        *out = nullptr;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *out = reinterpret_cast<CUgraph>(c->graph);
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamEndCapture(CUstream h, CUgraph* g) {
    FK_ENTER();
    return end_capture(h, g, false);
}
FK_API CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream h, CUgraph* g) {
    FK_ENTER();
    return end_capture(h, g, true);
}

static CUresult capture_info(CUstream h, bool ptds, CUstreamCaptureStatus* st, cuuint64_t* id, CUgraph* g,
                             const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps) {
    if (!st) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    auto c = s->capture;
    if (!c) {
        *st = CU_STREAM_CAPTURE_STATUS_NONE;
    } else {
        *st = c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
        if (id) *id = c->id;
        if (g) *g = reinterpret_cast<CUgraph>(c->graph);
    }
    if (deps) *deps = nullptr;
    if (edges) *edges = nullptr;
    if (ndeps) *ndeps = 0;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* st) {
    FK_ENTER();
    return capture_info(h, false, st, nullptr, nullptr, nullptr, nullptr, nullptr);
}
FK_API CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus* st) {
    FK_ENTER();
    return capture_info(h, true, st, nullptr, nullptr, nullptr, nullptr, nullptr);
}
FK_API CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus* st, cuuint64_t* id) {
    FK_ENTER();
    return capture_info(h, false, st, id, nullptr, nullptr, nullptr, nullptr);
}
FK_API CUresult CUDAAPI cuStreamGetCaptureInfo_ptsz(CUstream h, CUstreamCaptureStatus* st, cuuint64_t* id) {
    FK_ENTER();
    return capture_info(h, true, st, id, nullptr, nullptr, nullptr, nullptr);
}
FK_API CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus* st, cuuint64_t* id, CUgraph* g,
                                                  const CUgraphNode** deps, size_t* n) {
    FK_ENTER();
    return capture_info(h, false, st, id, g, deps, nullptr, n);
}
FK_API CUresult CUDAAPI cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus* st, cuuint64_t* id, CUgraph* g,
                                                       const CUgraphNode** deps, size_t* n) {
    FK_ENTER();
    return capture_info(h, true, st, id, g, deps, nullptr, n);
}
FK_API CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus* st, cuuint64_t* id, CUgraph* g,
                                                  const CUgraphNode** deps, const CUgraphEdgeData** e, size_t* n) {
    FK_ENTER();
    return capture_info(h, false, st, id, g, deps, e, n);
}
FK_API CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus* st, cuuint64_t* id, CUgraph* g,
                                                       const CUgraphNode** deps, const CUgraphEdgeData** e, size_t* n) {
    FK_ENTER();
    return capture_info(h, true, st, id, g, deps, e, n);
}

FK_API CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
    FK_ENTER();
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuGraphCreate(CUgraph* g, unsigned int flags) {
    FK_ENTER();
    if (!g || flags) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Graph* gr = new Graph;
    drv().graphs.insert(gr);
    *g = reinterpret_cast<CUgraph>(gr);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuGraphDestroy(CUgraph g) {
    FK_ENTER();
    std::lock_guard<std::mutex> lk(g_mu);
    Graph* gr = reinterpret_cast<Graph*>(g);
    if (!drv().graphs.erase(gr)) return CUDA_ERROR_INVALID_VALUE;
    for (CUdeviceptr p : gr->freed_in_graph) {
        auto it = drv().allocs.find(p);
        if (it != drv().allocs.end()) free_linear_locked(it);
    }
    delete gr;
    return CUDA_SUCCESS;
}

static CUresult instantiate(CUgraphExec* out, CUgraph g) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Graph* gr = reinterpret_cast<Graph*>(g);
    if (!drv().graphs.count(gr)) return CUDA_ERROR_INVALID_VALUE;
    auto* ex = new GraphExec;
    ex->ops = gr->ops;
    drv().graph_execs.insert(ex);
    *out = reinterpret_cast<CUgraphExec>(ex);
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph g, unsigned long long flags) {
    FK_ENTER();
    (void)flags;
    return instantiate(out, g);
}
FK_API CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* out, CUgraph g, CUgraphNode* err, char* log, size_t n) {
    FK_ENTER();
    if (err) *err = nullptr;
    if (log && n) log[0] = 0;
    return instantiate(out, g);
}
FK_API CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* out, CUgraph g, CUgraphNode* err, char* log, size_t n) {
    FK_ENTER();
    if (err) *err = nullptr;
    if (log && n) log[0] = 0;
    return instantiate(out, g);
}

FK_API CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec e) {
    FK_ENTER();
    std::lock_guard<std::mutex> lk(g_mu);
    auto* ex = reinterpret_cast<GraphExec*>(e);
    if (!drv().graph_execs.erase(ex)) return CUDA_ERROR_INVALID_VALUE;
    delete ex;
    return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec e, CUstream h, bool ptds) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto* ex = reinterpret_cast<GraphExec*>(e);
    if (!drv().graph_execs.count(ex)) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    for (auto& fn : ex->ops) submit_locked(s, fn);  // replays what was captured
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuGraphLaunch(CUgraphExec e, CUstream h) {
    FK_ENTER();
    return graph_launch(e, h, false);
}
FK_API CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec e, CUstream h) {
    FK_ENTER();
    return graph_launch(e, h, true);
}
FK_API CUresult CUDAAPI cuGraphUpload(CUgraphExec e, CUstream h) {
    FK_ENTER();
    (void)e, (void)h;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec e, CUstream h) {
    FK_ENTER();
    (void)e, (void)h;
    return CUDA_SUCCESS;
}

// --- virtual memory management ---------------------------------------------------------------
FK_API CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* gran, const CUmemAllocationProp* prop,
                                                       CUmemAllocationGranularity_flags option) {
    FK_ENTER();
    if (!gran || !prop || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    if (!drv().devices[size_t(prop->location.id)]->vmm) return CUDA_ERROR_NOT_SUPPORTED;
    *gran = drv().vm_gran;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                             unsigned long long flags) {
    FK_ENTER();
    (void)flags;
    // It names no device: refused only where no device has virtual memory management.
    if (std::none_of(drv().devices.begin(), drv().devices.end(), [](const auto& d) { return d->vmm; }))
        return CUDA_ERROR_NOT_SUPPORTED;
    size_t g = drv().vm_gran;
    if (!ptr || size == 0 || size % g || (alignment & (alignment - 1)) || addr % g) return CUDA_ERROR_INVALID_VALUE;
    size_t align = std::max(alignment, g);
    size_t span = size + align;
    void* r = mmap(reinterpret_cast<void*>(addr), span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t a = (uintptr_t(r) + align - 1) & ~(uintptr_t(align) - 1);
    if (a > uintptr_t(r)) munmap(r, a - uintptr_t(r));
    uintptr_t end = uintptr_t(r) + span;
    if (end > a + size) munmap(reinterpret_cast<void*>(a + size), end - (a + size));
    std::lock_guard<std::mutex> lk(g_mu);
    drv().reservations[a] = Reservation{a, size};
    *ptr = a;
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    FK_ENTER();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = drv().reservations.find(ptr);
    if (it == drv().reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
    auto m = drv().mappings.lower_bound(ptr);
    if (m != drv().mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;  // still mapped
    munmap(reinterpret_cast<void*>(ptr), size);
    drv().reservations.erase(it);
    return CUDA_SUCCESS;
}

namespace {
void vm_handle_unref_locked(VmHandle* h) {
    if (--h->refs > 0) return;
    Device& d = *drv().devices[size_t(h->dev)];
    if (!h->imported) d.used -= h->size;
    close(h->fd);
    drv().vm_handles.erase(h);
    delete h;
}
}  // namespace

FK_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                                     unsigned long long flags) {
    FK_ENTER();
    if (!handle || !prop || flags || size == 0 || size % drv().vm_gran) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    const auto types = static_cast<unsigned>(prop->requestedHandleTypes);
    if (types & ~unsigned(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
                          CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC))
        return CUDA_ERROR_INVALID_VALUE;
    // Only POSIX file descriptors on Linux; FAKE_CUDA_NO_FD_EXPORT=1 refuses those too.
    if (types & ~unsigned(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) return CUDA_ERROR_NOT_SUPPORTED;
    if (types && env_size("FAKE_CUDA_NO_FD_EXPORT", 0) != 0) return CUDA_ERROR_NOT_SUPPORTED;
    std::lock_guard<std::mutex> lk(g_mu);
    Device& d = *drv().devices[size_t(prop->location.id)];
    if (!d.vmm) return CUDA_ERROR_NOT_SUPPORTED;
    if (d.used + size > d.total) return CUDA_ERROR_OUT_OF_MEMORY;
    // The name carries the device, for cuMemImportFromShareableHandle in another process.
    char name[32];
    snprintf(name, sizeof name, "fakecuda-vm-dev%d", prop->location.id);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, off_t(size)) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    auto* h = new VmHandle{prop->location.id, size, fd};
    h->exportable = types != 0;
    d.used += size;
    drv().vm_handles.insert(h);
    note_usage_locked();
    *handle = CUmemGenericAllocationHandle(reinterpret_cast<uintptr_t>(h));
    return CUDA_SUCCESS;
}

// A POSIX file descriptor for a handle made exportable: a duplicate of its memfd (close-on-exec),
// which the caller owns. What the real driver answers for a handle made without the type is
// not measured; INVALID_VALUE here.
FK_API CUresult CUDAAPI cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                                      CUmemAllocationHandleType type, unsigned long long flags) {
    FK_ENTER();
    if (!shareable || flags) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    std::lock_guard<std::mutex> lk(g_mu);
    auto* h = reinterpret_cast<VmHandle*>(uintptr_t(handle));
    if (!drv().vm_handles.count(h) || h->released || !h->exportable) return CUDA_ERROR_INVALID_VALUE;
    const int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *static_cast<int*>(shareable) = fd;
    return CUDA_SUCCESS;
}

// A handle for the memory behind a descriptor that cuMemExportToShareableHandle gave (in any
// process): the caller keeps the descriptor. Anything else is an invalid value.
FK_API CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                                        CUmemAllocationHandleType type) {
    FK_ENTER();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    const int fd = int(reinterpret_cast<uintptr_t>(os_handle));
    char link[64], target[128] = {};
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, target, sizeof target - 1);
    int dev = -1;
    if (n <= 0 || sscanf(target, "/memfd:fakecuda-vm-dev%d", &dev) != 1) return CUDA_ERROR_INVALID_VALUE;
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_size <= 0 || size_t(st.st_size) % drv().vm_gran) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> lk(g_mu);
    auto* h = new VmHandle{dev, size_t(st.st_size), own};
    h->exportable = true;
    h->imported = true;
    drv().vm_handles.insert(h);
    *handle = CUmemGenericAllocationHandle(reinterpret_cast<uintptr_t>(h));
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
    FK_ENTER();
    std::lock_guard<std::mutex> lk(g_mu);
    auto* h = reinterpret_cast<VmHandle*>(uintptr_t(handle));
    if (!drv().vm_handles.count(h)) return CUDA_ERROR_INVALID_VALUE;
    if (h->retains > 0) {
        --h->retains;
    } else {
        if (h->released) return CUDA_ERROR_INVALID_VALUE;
        h->released = true;
    }
    vm_handle_unref_locked(h);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                  unsigned long long flags) {
    FK_ENTER();
    size_t g = drv().vm_gran;
    if (flags || size == 0 || ptr % g || size % g || offset % g) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto* h = reinterpret_cast<VmHandle*>(uintptr_t(handle));
    if (!drv().vm_handles.count(h) || h->released) return CUDA_ERROR_INVALID_HANDLE;
    if (offset + size > h->size) return CUDA_ERROR_INVALID_VALUE;
    // Must lie inside one reservation.
    auto r = drv().reservations.upper_bound(ptr);
    if (r == drv().reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
    --r;
    if (ptr < r->first || ptr + size > r->first + r->second.size) return CUDA_ERROR_INVALID_VALUE;
    // Must not overlap an existing mapping.
    auto m = drv().mappings.lower_bound(ptr);
    if (m != drv().mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
    if (m != drv().mappings.begin()) {
        auto p = std::prev(m);
        if (p->first + p->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
    }
    void* res = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, off_t(offset));
    if (res == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    ++h->refs;
    drv().mappings[ptr] = VmMapping{ptr, size, h, offset, CU_MEM_ACCESS_FLAGS_PROT_NONE, drv().next_buffer_id++};
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
    FK_ENTER();
    size_t g = drv().vm_gran;
    if (size == 0 || ptr % g || size % g) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    // The range must be exactly covered by whole mappings.
    auto first = drv().mappings.find(ptr);
    if (first == drv().mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr cur = ptr;
    auto it = first;
    while (cur < ptr + size) {
        if (it == drv().mappings.end() || it->first != cur) return CUDA_ERROR_INVALID_VALUE;
        cur += it->second.size;
        ++it;
    }
    if (cur != ptr + size) return CUDA_ERROR_INVALID_VALUE;
    mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    for (auto e = first; e != it;) {
        vm_handle_unref_locked(e->second.handle);
        e = drv().mappings.erase(e);
    }
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
    FK_ENTER();
    size_t g = drv().vm_gran;
    if (!desc || count == 0 || size == 0 || ptr % g || size % g) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || check_dev(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    std::lock_guard<std::mutex> lk(g_mu);
    CUdeviceptr cur = ptr;
    std::vector<VmMapping*> ms;
    while (cur < ptr + size) {
        auto m = find_mapping_locked(cur);
        if (m == drv().mappings.end()) return CUDA_ERROR_INVALID_VALUE;
        ms.push_back(&m->second);
        cur = m->first + m->second.size;
    }
    // Each device's access is its own (the host sees the widest of them).
    for (auto* m : ms) {
        for (size_t i = 0; i < count; ++i) {
            if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) m->by_dev.erase(desc[i].location.id);
            else m->by_dev[desc[i].location.id] = desc[i].flags;
        }
        unsigned long long flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
        for (const auto& [dev, f] : m->by_dev) flags |= f;
        int prot = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                   : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                               : PROT_NONE;
        if (mprotect(reinterpret_cast<void*>(m->base), m->size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
        m->access = flags;
    }
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* loc, CUdeviceptr ptr) {
    FK_ENTER();
    if (!flags || !loc || loc->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto m = find_mapping_locked(ptr);
    if (m == drv().mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    auto f = m->second.by_dev.find(loc->id);
    *flags = f == m->second.by_dev.end() ? static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_NONE) : static_cast<unsigned long long>(f->second);
    return CUDA_SUCCESS;
}

// The handle mapped at `addr`, with one more reference the program releases (cuMemRelease).
FK_API CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
    FK_ENTER();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto m = find_mapping_locked(reinterpret_cast<CUdeviceptr>(addr));
    if (m == drv().mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    VmHandle* h = m->second.handle;
    ++h->refs;
    ++h->retains;
    *handle = CUmemGenericAllocationHandle(reinterpret_cast<uintptr_t>(h));
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                                CUmemGenericAllocationHandle handle) {
    FK_ENTER();
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto* h = reinterpret_cast<VmHandle*>(uintptr_t(handle));
    if (!drv().vm_handles.count(h)) return CUDA_ERROR_INVALID_VALUE;
    *prop = CUmemAllocationProp{};
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = h->dev;
    return CUDA_SUCCESS;
}

// --- IPC --------------------------------------------------------------------------------------
FK_API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
    FK_ENTER();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    // Any pointer into a cuMemAlloc allocation; the handle names the whole allocation.
    auto it = find_alloc_locked(dptr);
    if (it == drv().allocs.end() || (it->second.kind != Kind::Linear && it->second.kind != Kind::Pitch))
        return CUDA_ERROR_INVALID_VALUE;
    const Device& d = *drv().devices[size_t(it->second.ctx->dev)];
    IpcPayload pl{kIpcMagic, int32_t(getpid()), d.arena_fd, d.ordinal, it->second.arena_off, it->second.size, it->second.buffer_id};
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &pl, sizeof pl);
    return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
    FK_ENTER();
    if (!pdptr || (flags & ~unsigned(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))) return CUDA_ERROR_INVALID_VALUE;
    if (!current_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    IpcPayload pl;
    memcpy(&pl, handle.reserved, sizeof pl);
    if (pl.magic != kIpcMagic) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    if (pl.pid == getpid()) {
        // Same process: the original mapping.
        if (pl.dev < 0 || pl.dev >= drv().ndev) return CUDA_ERROR_INVALID_VALUE;
        Device& d = *drv().devices[size_t(pl.dev)];
        CUdeviceptr p = CUdeviceptr(d.arena + pl.arena_off);
        auto it = drv().allocs.find(p);
        if (!d.arena || it == drv().allocs.end() || it->second.buffer_id != pl.buffer_id) return CUDA_ERROR_INVALID_VALUE;
        auto imp = drv().imports.find(p);
        if (imp != drv().imports.end()) ++imp->second.refs;
        else drv().imports[p] = IpcImport{p, size_t(pl.size), nullptr, 0, 1};
        *pdptr = p;
        return CUDA_SUCCESS;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pl.pid, pl.fd);
    int fd = open(path, O_RDWR);
    if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
    size_t pg = size_t(sysconf(_SC_PAGESIZE));
    size_t off0 = pl.arena_off / pg * pg;
    size_t len = (pl.arena_off + pl.size + pg - 1) / pg * pg - off0;
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(off0));
    close(fd);
    if (m == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = CUdeviceptr(m) + (pl.arena_off - off0);
    drv().imports[p] = IpcImport{p, size_t(pl.size), m, len, 1};
    *pdptr = p;
    return CUDA_SUCCESS;
}
FK_API CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {  // counted as _v2
    return cuIpcOpenMemHandle_v2(pdptr, handle, flags);
}

FK_API CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
    FK_ENTER();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = drv().imports.find(dptr);
    if (it == drv().imports.end()) return CUDA_ERROR_INVALID_VALUE;
    if (--it->second.refs > 0) return CUDA_SUCCESS;
    if (it->second.map_base) munmap(it->second.map_base, it->second.map_len);
    drv().imports.erase(it);
    return CUDA_SUCCESS;
}

// --- misc often-called helpers ---------------------------------------------------------------
FK_API CUresult CUDAAPI cuGetExportTable(const void** table, const CUuuid* id) {
    FK_ENTER_NOINIT();
    if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
    *table = nullptr;
    return CUDA_ERROR_NOT_SUPPORTED;
}

FK_API CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
    FK_ENTER();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    static char pools[64];
    *pool = reinterpret_cast<CUmemoryPool>(&pools[dev]);
    return CUDA_SUCCESS;
}

// No cuDeviceSetMemPool here: a device's current pool is its default pool.
FK_API CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
    return cuDeviceGetDefaultMemPool(pool, dev);
}

// The fake's stream-ordered allocations hold nothing back: there is nothing to trim.
FK_API CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t) {
    FK_ENTER();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

// --- cuGetProcAddress ----------------------------------------------------------------------------
namespace {
struct ProcRow {
    const char* base;
    int version;
    const char* exported;
    const char* per_thread;
};
const ProcRow kProcs[] = {
#define FK_PROC(b, v, e, p) {b, v, e, p},
#include "proc_table.inc"
#undef FK_PROC
};

void* self_handle() {
    static void* h = [] {
        Dl_info info{};
        dladdr(reinterpret_cast<void*>(&cuInit), &info);
        void* hh = info.dli_fname ? dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD) : nullptr;
        return hh;
    }();
    return h;
}

CUresult get_proc(const char* symbol, void** pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~cuuint64_t(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = nullptr;
    if (symbol[0] == 0) {
        // The runtime's empty-name probe (version 0) succeeds with the real driver.
        if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    const ProcRow* best = nullptr;
    bool any = false;
    for (const auto& r : kProcs) {
        if (strcmp(r.base, symbol) != 0) continue;
        any = true;
        if (r.version <= version && (!best || r.version > best->version)) best = &r;
    }
    if (!best) {
        if (status) *status = any ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    const char* name = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->per_thread[0] ? best->per_thread
                                                                                                      : best->exported;
    void* f = self_handle() ? dlsym(self_handle(), name) : nullptr;
    if (!f) {
        if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = f;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}
}  // namespace

FK_API CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* status) {
    FK_ENTER_NOINIT();
    return get_proc(symbol, pfn, version, flags, status);
}
FK_API CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
    FK_ENTER_NOINIT();
    return get_proc(symbol, pfn, version, flags, nullptr);
}

// =========================================================================================
// Test-only controls
// =========================================================================================
namespace {
uint64_t count_locked(const Accounting& a, const char* api) {
    uint64_t n = 0;
    for (auto& [name, c] : a.calls)
        if (name == api || base_name(name.c_str()) == api) n += c;
    return n;
}

// A "kernel" that touches [ptr, ptr+bytes) from the stream's device: virtual memory mapped there
// without access for that device fails it with CUDA_ERROR_ILLEGAL_ADDRESS, as such a kernel
// faults on the GPU. (Linear memory is not checked: its peer access is the context's.)
CUresult launch(CUstream h, std::function<void()> fn, CUdeviceptr ptr = 0, size_t bytes = 0, bool ptds = false) {
    if (g_forked_child.load()) return CUDA_ERROR_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s)) return r;
    for (auto m = find_mapping_locked(ptr); bytes != 0 && m != drv().mappings.end() && m->first < ptr + bytes; ++m) {
        if (!m->second.by_dev.count(s->ctx->dev)) return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    if (s->capture && s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    submit_locked(s, std::move(fn));
    return CUDA_SUCCESS;
}
}  // namespace

FK_API void fakecuda_stats(fakecuda_stats_t* out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    {
        std::lock_guard<std::mutex> lk(g_mu);
        for (auto& d : drv().devices) out->bytes_in_use += d->used;
        out->live_allocations = drv().live_allocations;
        out->live_vm_handles = drv().vm_handles.size();
        out->live_host_allocations = drv().host_allocs.size();
        out->host_bytes_in_use = drv().host_bytes;
    }
    Accounting& a = acct();
    std::lock_guard<std::mutex> lk(a.mu);
    out->mem_alloc = count_locked(a, "cuMemAlloc");
    out->mem_free = count_locked(a, "cuMemFree");
    out->mem_alloc_async = count_locked(a, "cuMemAllocAsync") + count_locked(a, "cuMemAllocFromPoolAsync");
    out->mem_free_async = count_locked(a, "cuMemFreeAsync");
    out->mem_alloc_managed = count_locked(a, "cuMemAllocManaged");
    out->mem_alloc_pitch = count_locked(a, "cuMemAllocPitch");
    out->vm_reserve = count_locked(a, "cuMemAddressReserve");
    out->vm_address_free = count_locked(a, "cuMemAddressFree");
    out->vm_create = count_locked(a, "cuMemCreate");
    out->vm_release = count_locked(a, "cuMemRelease");
    out->vm_map = count_locked(a, "cuMemMap");
    out->vm_unmap = count_locked(a, "cuMemUnmap");
    out->vm_set_access = count_locked(a, "cuMemSetAccess");
    out->stream_sync = count_locked(a, "cuStreamSynchronize");
    out->ctx_sync = count_locked(a, "cuCtxSynchronize");
    out->host_alloc = count_locked(a, "cuMemHostAlloc") + count_locked(a, "cuMemAllocHost");
    out->host_free = count_locked(a, "cuMemFreeHost");
    out->peak_bytes_in_use = std::max(a.peak, out->bytes_in_use);
}

FK_API CUresult fakecuda_native_pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    bool known;
    return pointer_attr_locked(attribute, data, ptr, &known);
}

FK_API void fakecuda_reset_stats(void) {
    uint64_t used = 0;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        for (auto& d : drv().devices) used += d->used;
    }
    Accounting& a = acct();
    std::lock_guard<std::mutex> lk(a.mu);
    a.calls.clear();
    a.peak = used;
}

FK_API uint64_t fakecuda_call_count(const char* api) {
    if (!api) return 0;
    Accounting& a = acct();
    std::lock_guard<std::mutex> lk(a.mu);
    return count_locked(a, api);
}

FK_API void fakecuda_fail_next(const char* api, int after_n_calls, CUresult code) {
    if (!api) return;
    Accounting& a = acct();
    std::lock_guard<std::mutex> lk(a.mu);
    a.faults.push_back(Fault{api, std::max(after_n_calls, 0), code});
}

FK_API void fakecuda_clear_failures(void) {
    Accounting& a = acct();
    std::lock_guard<std::mutex> lk(a.mu);
    a.faults.clear();
}

// The "kernels": what each does when its stream reaches it.
namespace {
std::function<void()> write_work(CUdeviceptr ptr, size_t bytes, unsigned char value, unsigned delay_us) {
    return [=] {
        if (delay_us) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        memset(reinterpret_cast<void*>(ptr), value, bytes);
    };
}
std::function<void()> fill_check_work(CUdeviceptr ptr, size_t bytes, unsigned char expected, unsigned delay_us,
                                      unsigned long long* mismatches) {
    return [=] {
        if (delay_us) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        const auto* p = reinterpret_cast<const unsigned char*>(ptr);
        unsigned long long n = 0;
        for (size_t i = 0; i < bytes; ++i) n += p[i] != expected;
        __atomic_add_fetch(mismatches, n, __ATOMIC_SEQ_CST);
    };
}
std::function<void()> sleep_work(unsigned delay_us) {
    return [=] { std::this_thread::sleep_for(std::chrono::microseconds(delay_us)); };
}
}  // namespace

FK_API CUresult fakecuda_launch_write(CUstream stream, CUdeviceptr ptr, size_t bytes, unsigned char value, unsigned delay_us) {
    return launch(stream, write_work(ptr, bytes, value, delay_us), ptr, bytes);
}

FK_API CUresult fakecuda_launch_fill_check(CUstream stream, CUdeviceptr ptr, size_t bytes, unsigned char expected,
                                           unsigned delay_us, unsigned long long* mismatches) {
    if (!mismatches) return CUDA_ERROR_INVALID_VALUE;
    return launch(stream, fill_check_work(ptr, bytes, expected, delay_us, mismatches), ptr, bytes);
}

FK_API CUresult fakecuda_launch_sleep(CUstream stream, unsigned delay_us) {
    return launch(stream, sleep_work(delay_us));
}

// cuLaunchKernel of the "kernels" above: `f` is the address of fakecuda_launch_write,
// fakecuda_launch_fill_check or fakecuda_launch_sleep, and kernelParams point at its arguments
// after the stream, in order. The grid and block are ignored.
namespace {
CUresult launch_kernel(CUfunction f, CUstream h, void** params, bool ptds) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    const auto kernel = reinterpret_cast<void*>(f);
    if (kernel == reinterpret_cast<void*>(&fakecuda_launch_write)) {
        const CUdeviceptr ptr = *static_cast<CUdeviceptr*>(params[0]);
        const size_t bytes = *static_cast<size_t*>(params[1]);
        return launch(h, write_work(ptr, bytes, *static_cast<unsigned char*>(params[2]), *static_cast<unsigned*>(params[3])),
                      ptr, bytes, ptds);
    }
    if (kernel == reinterpret_cast<void*>(&fakecuda_launch_fill_check)) {
        const CUdeviceptr ptr = *static_cast<CUdeviceptr*>(params[0]);
        const size_t bytes = *static_cast<size_t*>(params[1]);
        unsigned long long* mismatches = *static_cast<unsigned long long**>(params[4]);
        if (!mismatches) return CUDA_ERROR_INVALID_VALUE;
        return launch(h, fill_check_work(ptr, bytes, *static_cast<unsigned char*>(params[2]),
                                         *static_cast<unsigned*>(params[3]), mismatches),
                      ptr, bytes, ptds);
    }
    if (kernel == reinterpret_cast<void*>(&fakecuda_launch_sleep)) {
        return launch(h, sleep_work(*static_cast<unsigned*>(params[0])), 0, 0, ptds);
    }
    return CUDA_ERROR_INVALID_HANDLE;
}
}  // namespace

FK_API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                       unsigned, CUstream h, void** params, void**) {
    FK_ENTER();
    return launch_kernel(f, h, params, false);
}
FK_API CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned,
                                            unsigned, unsigned, CUstream h, void** params, void**) {
    FK_ENTER();
    return launch_kernel(f, h, params, true);
}
