// One caching allocator per CUDA context, so a device's blocks never serve another device
// and a context that goes away (cuCtxDestroy, cudaDeviceReset) takes only its own blocks.
#pragma once

#include <atomic>
#include <functional>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/host_cache.h"
#include "driver/capture.h"
#include "driver/cuda_api.h"
#include "driver/driver_backend.h"
#include "driver/host_backend.h"
#include "driver/single_stream.h"
#include "driver/streams.h"

namespace cudalloc::shim {

// Each part on lines of its own: every call reads ctx (to find the state) and allocator (its
// pointer to the core), while every device fence takes the backend's mutex. Sharing the first
// line with that mutex, the lookup of ctx missed under 8 threads of cudaMalloc pairs.
struct ContextState {
  ContextState(CUcontext ctx, CUdevice device, const AllocatorOptions& options, CaptureTracker& captures,
               HostBudget& host_budget, LiveDeviceFences& contexts, SubmissionWatch* watch);
  CUcontext ctx;
  CUdevice device;
  alignas(64) DriverBackend backend;
  alignas(64) DeviceAllocator allocator;
  // Pinned host memory allocated in this context (it goes with the context).
  alignas(64) DriverHostBackend host_backend;
  HostCache host;
};

// Heap storage that holds whole cache lines: a small allocation shares its line with whatever
// malloc put beside it, and the list of contexts is read on every call.
template <typename T>
struct LineAllocator {
  using value_type = T;
  static constexpr std::size_t kLine = 64;
  LineAllocator() = default;
  template <typename U>
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + kLine - 1) / kLine * kLine;
    return static_cast<T*>(::operator new(bytes, std::align_val_t{kLine}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t{kLine}); }
  template <typename U>
  bool operator==(const LineAllocator<U>&) const { return true; }
};

// The live contexts, replaced (never modified) when one comes or goes. A green context has no
// state of its own: its memory is its device's primary context's (the driver says so of every
// allocation made under one), so it names the primary's state here.
struct alignas(64) ContextList {
  using States = std::vector<ContextState*, LineAllocator<ContextState*>>;
  States states;
  // A green context, the primary's state it names, and its own legacy stream: a stream key
  // apart from the primary's legacy stream (the two are not ordered with each other), a
  // stream of the green context for the backend (its fences record there, in that context).
  // It has no per-thread default stream (ContextRegistry::find).
  struct Alias {
    CUcontext green;
    ContextState* state;
    StreamInfo* legacy;
  };
  std::vector<Alias> aliases;
};

// Where the allocators of new contexts report (the shim's observers: trace, NVTX). Functions,
// asked at each new context, so that the registry needs nothing of the shim.
struct ContextObservers {
  AllocatorObserver* (*device)() = nullptr;  // for each context's DeviceAllocator
  AllocatorObserver* (*host)() = nullptr;    // for each context's HostCache
};

class ContextRegistry final : public OrderedEras, public LiveDeviceFences {
 public:
  // `watch`: the program's queued work, as the shim sees it (null: not watched); each context's
  // backend hands it to its allocator (allocator/submission_watch.h).
  ContextRegistry(const AllocatorOptions& options, CaptureTracker& captures, SingleStreamMode& single_stream,
                  ContextObservers observers, SubmissionWatch* watch = nullptr)
      : options_(options), captures_(captures), single_stream_(single_stream), observers_(observers), watch_(watch),
        host_budget_(options.pinned_memory_limit_bytes) {}

  // The state of the calling thread's current context; null when there is none.
  // `stream` (optional): the stream a memory call names, resolved from the calling thread;
  // when the current context is a green one and that is the legacy stream, it becomes the green
  // context's own; the per-thread stream, which a green context does not have, becomes null.
  ContextState* current(StreamInfo** stream = nullptr);
  // The state of `ctx`, made if needed (the context need not be current).
  ContextState* get(CUcontext ctx, StreamInfo** stream = nullptr) {
    if (ContextState* s = find(ctx, stream)) return s;
    return ctx == nullptr ? nullptr : make(ctx);
  }
  ContextState* find(CUcontext ctx, StreamInfo** stream = nullptr) const {
    const ContextList& list = *snapshot_.load(std::memory_order_acquire);
    for (ContextState* s : list.states) {
      if (s->ctx == ctx) return s;
    }
    for (const ContextList::Alias& a : list.aliases) {
      if (a.green == ctx) return in_green(a, stream);
    }
    return nullptr;
  }
  // Whether some green context names a state (then the default stream a call names depends on
  // the thread's current context: default_of).
  bool any_alias() const { return any_alias_.load(std::memory_order_acquire); }
  // `stream` as the calling thread's current context sees it (see current()): null for the
  // per-thread stream under a green context. The flag first: with no green context, one test.
  StreamInfo* default_of(StreamInfo* stream) {
    if (stream == nullptr || !any_alias() || stream->kind == StreamInfo::Kind::kCreated) [[likely]] return stream;
    return default_of_slow(stream);
  }
  // A green context (cuCtxFromGreenCtx) names `primary`'s state from now on; unalias: it is gone.
  void alias(CUcontext green, ContextState* primary);
  void unalias(CUcontext green);
  // The state whose allocator holds `p` (live, free or pending); null if none.
  ContextState* owner(CUdeviceptr p) const;
  // The live states (a snapshot: safe to use while others change the registry).
  const ContextList::States& live() const { return snapshot_.load(std::memory_order_acquire)->states; }
  bool is_live(const ContextState* s) const;
  // The context is gone: forget its blocks without touching the device, never use it again.
  // Returns the parked frees to run if its captures were the last ones (run_parked).
  std::vector<ParkedFree> drop(CUcontext ctx);
  // Gives back the idle pinned memory of every context's host cache (waiting for its fences);
  // whether any went.
  bool release_host_caches();
  const HostBudget& host_budget() const { return host_budget_; }
  // Idle memory of a device that no context's allocator holds (the program's cached virtual
  // memory pairs): given back, like the other contexts' caches, before an allocation of the
  // device fails for want of memory. Returns the bytes released. Set before the first context.
  void set_device_reclaimer(std::function<std::size_t(CUdevice)> f) { device_reclaimer_ = std::move(f); }

  // single_stream's end: every live context records the end of its ordered era.
  void end_ordered_eras() override;
  // For pinned memory: a device fence in every live context.
  void record_device_fences(std::vector<std::unique_ptr<Fence>>& out) override;

  // A memory limit set through the C API (cudalloc_set_memory_fraction / _limit) for a device:
  // it replaces the configured fraction and cap for that device, in its live allocators and in
  // those made later. bytes 0: no cap in bytes.
  struct LimitSetting {
    double fraction = 1.0;
    std::size_t bytes = 0;
  };
  void set_limit(CUdevice dev, LimitSetting setting);
  // The device's setting: the API's if one was set, else the configuration's.
  LimitSetting limit_setting(CUdevice dev);

  // Peer access enabled from device `peer` to memory of device `owner`: the virtual memory of
  // `owner`'s contexts, those made later included, is opened to `peer` (DriverBackend::grant_peer).
  void grant_peer(CUdevice owner, CUdevice peer);

 private:
  ContextState* make(CUcontext ctx);  // get() of a context met for the first time
  // Releases the idle caches of the other contexts of `s`'s device; whether any memory went.
  bool release_others(const ContextState& s);
  StreamInfo* default_of_slow(StreamInfo* stream);
  static void apply_limit(ContextState& s, LimitSetting setting);
  // find() of green context `a`: its state, and in `stream` (optional), the stream a call names
  // as that context has it (see current()). Out of line, and called last, so that find() needs
  // no more registers for a context that is not green.
  __attribute__((returns_nonnull)) static ContextState* in_green(const ContextList::Alias& a, StreamInfo** stream);
  // Makes `next` the snapshot. Under mutex_.
  void publish_locked(const ContextList* next) {
    any_alias_.store(!next->aliases.empty(), std::memory_order_release);
    snapshot_.store(next, std::memory_order_release);
  }

  const AllocatorOptions& options_;
  CaptureTracker& captures_;
  SingleStreamMode& single_stream_;  // ends when a second context is in use
  const ContextObservers observers_;
  SubmissionWatch* const watch_;
  std::mutex mutex_;  // writers, budgets_ and the warned sets
  // Each device's memory against the limit, shared by the allocators of its contexts (never
  // freed, as the states).
  std::map<CUdevice, std::shared_ptr<DeviceBudget>> budgets_;
  // Devices whose lack of virtual memory was reported (one warning each, whatever the contexts).
  std::set<CUdevice> vm_warned_;
  std::map<CUdevice, LimitSetting> limits_;  // set_limit
  std::set<CUdevice> small_limit_warned_;
  std::map<CUdevice, std::set<CUdevice>> peers_;  // grant_peer: owner -> devices granted
  // Replaced, never modified, on a change; old snapshots are leaked (contexts are few).
  std::atomic<const ContextList*> snapshot_{new ContextList};
  // Whether the snapshot has aliases: what a free on a default stream asks (default_of), in one
  // load from the registry rather than two through the snapshot.
  std::atomic<bool> any_alias_{false};
  // The pinned memory of every context's host cache together (pinned_memory_limit_mb).
  HostBudget host_budget_;
  std::function<std::size_t(CUdevice)> device_reclaimer_;
};

}  // namespace cudalloc::shim
