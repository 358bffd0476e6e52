#include "driver/driver_backend.h"

#include <algorithm>
#include <utility>

#include "driver/current_context.h"
#include "driver/driver_api.h"
#include "support/log.h"
#include "support/profile.h"

namespace cudalloc::shim {

namespace {

// The driver's own error behind the calling thread's last kBackendError, for the program.
thread_local CUresult t_refusal = CUDA_SUCCESS;

Status refuse(CUresult r) {
  t_refusal = r;
  return Status::kBackendError;
}

Status to_status(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return Status::kOk;
    case CUDA_ERROR_OUT_OF_MEMORY: return Status::kOutOfMemory;
    case CUDA_ERROR_DEINITIALIZED: return Status::kDeinitialized;
    case CUDA_ERROR_INVALID_VALUE: return Status::kInvalidValue;
    default: return refuse(r);
  }
}

// NOT_READY is the only answer that means "still running": success, or an error (the driver
// is shutting down, the context is broken) both mean no work will touch the memory any more.
bool event_done(CUevent e) {
  profile::Scope timed(profile::Site::kFenceQuery);
  return driver().cuEventQuery(e) != CUDA_ERROR_NOT_READY;
}

// Whether a non-blocking stream has nothing queued that has not run: then no work queued
// before a free can still use its block there, and a device fence needs no event on it (nor a
// query of one later). Idle streams are common: a library's spare streams, a thread's stream
// between its launches. A stream found busy records events without being asked for the next
// kBusyFences fences, so a program whose streams are always busy pays a query per stream
// only that often. (Unlike an event, the query says nothing of blocking streams: the legacy
// stream keeps its event.)
constexpr std::uint8_t kBusyFences = 8;
bool stream_idle(StreamInfo& s, CUstream handle) {
  const DriverApi& d = driver();
  if (d.cuStreamQuery == nullptr) return false;
  if (const std::uint8_t skip = s.busy_fences.load(std::memory_order_relaxed); skip != 0) {
    s.busy_fences.store(static_cast<std::uint8_t>(skip - 1), std::memory_order_relaxed);
    return false;
  }
  const CUresult r = d.cuStreamQuery(handle);
  if (r == CUDA_ERROR_NOT_READY) s.busy_fences.store(kBusyFences, std::memory_order_relaxed);
  return r == CUDA_SUCCESS;
}

}  // namespace

// The last work of a non-blocking stream destroyed with work still queued.
struct DriverBackend::Tail {
  DriverBackend* backend;
  CUevent event;
  std::atomic<bool> done{false};
  Tail(DriverBackend* b, CUevent e) : backend(b), event(e) {}
  ~Tail() { backend->give_event(event); }
  bool query() {
    if (!done.load(std::memory_order_acquire) && event_done(event)) done.store(true, std::memory_order_release);
    return done.load(std::memory_order_acquire);
  }
};

namespace {

class DoneFence final : public Fence {
 public:
  bool done() override { return true; }
  bool wait() override { return true; }
};

// Events recorded on one or more streams (a stream fence has one, a device fence several).
class EventFence final : public Fence {
 public:
  explicit EventFence(DriverBackend* b) : backend_(b) {}
  ~EventFence() override {
    for (CUevent e : events) backend_->give_event(e);
  }
  bool done() override {
    if (backend_->dead()) return true;
    if (mark != nullptr) {
      if (!event_done(mark)) return false;
      mark = nullptr;
    }
    while (!events.empty()) {
      if (!event_done(events.back())) return false;
      backend_->give_event(events.back());
      events.pop_back();
    }
    while (!tails.empty()) {
      if (!tails.back()->query()) return false;
      tails.pop_back();
    }
    return true;
  }
  bool wait() override {
    if (backend_->dead()) return true;
    if (backend_->captures().any()) return done();  // synchronizing now could break a capture
    profile::Scope timed(profile::Site::kFenceWait);
    if (mark != nullptr) driver().cuEventSynchronize(mark);
    mark = nullptr;
    for (CUevent e : events) driver().cuEventSynchronize(e);
    for (auto& t : tails) driver().cuEventSynchronize(t->event);
    for (CUevent e : events) backend_->give_event(e);
    events.clear();
    tails.clear();
    return true;
  }

  bool orders_reuse() const override { return ordered; }

  std::vector<CUevent> events;  // owned: given back to the backend's pool
  std::vector<std::shared_ptr<DriverBackend::Tail>> tails;
  // An ordering fence's point: the backend's order mark, not owned. It may have been recorded
  // again since, later than this fence, which only makes done() and wait() later.
  CUevent mark = nullptr;
  bool ordered = false;  // see driver_backend.h

 private:
  DriverBackend* backend_;
};

// When no event could be recorded: the memory is only reusable once someone synchronized
// (the out-of-memory ladder, release_cached). Safe, and rare.
class SyncFence final : public Fence {
 public:
  explicit SyncFence(DriverBackend* b) : backend_(b) {}
  bool done() override { return synced_ || backend_->dead(); }
  bool wait() override {
    if (done()) return true;
    if (backend_->captures().any()) return false;
    CurrentContext current(backend_->context());
    driver().cuCtxSynchronize();
    synced_ = true;
    return true;
  }

 private:
  DriverBackend* backend_;
  bool synced_ = false;
};

// An event on a stream of another context (a block freed in the order of another device's
// stream): created in that context, and destroyed with the fence rather than pooled, since the
// backend's pool holds its own context's events.
class ForeignEventFence final : public Fence {
 public:
  ForeignEventFence(DriverBackend* b, CUevent e) : backend_(b), event_(e) {}
  ~ForeignEventFence() override { driver().cuEventDestroy_v2(event_); }
  bool done() override { return event_done(event_); }
  bool wait() override {
    if (backend_->captures().any()) return done();  // synchronizing now could break a capture
    profile::Scope timed(profile::Site::kFenceWait);
    driver().cuEventSynchronize(event_);
    return true;
  }

 private:
  DriverBackend* backend_;
  CUevent event_;
};

// Recorded while a capture was on: becomes a device fence once no capture is on.
class DeferredFence final : public Fence {
 public:
  explicit DeferredFence(DriverBackend* b) : backend_(b) {}
  bool done() override {
    if (backend_->dead()) return true;
    return materialize() && inner_->done();
  }
  bool wait() override {
    if (backend_->dead()) return true;
    return materialize() && inner_->wait();
  }

 private:
  bool materialize() {
    if (inner_) return true;
    if (backend_->captures().any()) return false;
    inner_ = backend_->device_fence_now();
    return true;
  }
  DriverBackend* backend_;
  std::unique_ptr<Fence> inner_;
};

}  // namespace

CUresult DriverBackend::take_refusal() { return std::exchange(t_refusal, CUDA_SUCCESS); }

DriverBackend::DriverBackend(CUcontext ctx, CUdevice device, CaptureTracker& captures, SubmissionWatch* watch)
    : ctx_(ctx), device_(device), captures_(captures), watch_(watch), access_devices_{device} {
  const DriverApi& d = driver();
  if (d.cuDeviceTotalMem_v2 == nullptr || d.cuDeviceTotalMem_v2(&total_, device) != CUDA_SUCCESS) {
    total_ = 0;
  }
}

// Backends live as long as the process (contexts that are gone keep theirs, dead).
DriverBackend::~DriverBackend() = default;

bool DriverBackend::dead() const {
  std::lock_guard lock(mutex_);
  return dead_;
}

void DriverBackend::mark_dead() {
  std::vector<std::shared_ptr<Tail>> tails;  // released after the lock: ~Tail takes it
  std::vector<std::pair<DevicePtr, std::size_t>> deferred;
  {
    std::lock_guard lock(mutex_);
    dead_ = true;
    free_events_.clear();  // destroyed with the context
    order_mark_.store(nullptr, std::memory_order_relaxed);  // so is this
    non_blocking_.clear();
    tails.swap(tails_);
    mapped_.clear();
    deferred.swap(deferred_frees_);
  }
  // The segments whose free waited for a capture's end went with the context: their room
  // under the limit is free now.
  for (const auto& [ptr, bytes] : deferred) deferred_done(ptr, bytes, true);
}

CUevent DriverBackend::take_event() {
  {
    std::lock_guard lock(mutex_);
    if (!free_events_.empty()) {
      CUevent e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  CUevent e = nullptr;
  if (driver().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  return e;
}

void DriverBackend::give_event(CUevent e) {
  if (e == nullptr) return;
  std::lock_guard lock(mutex_);
  if (!dead_) free_events_.push_back(e);
}

void DriverBackend::add_stream(StreamInfo* s, bool helper) {
  if (!s->non_blocking) return;
  CUevent mark = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (dead_ || std::find(non_blocking_.begin(), non_blocking_.end(), s) != non_blocking_.end()) return;
    s->helper.store(helper, std::memory_order_relaxed);
    non_blocking_.push_back(s);
    // Ordering fences end here (device_fence_now sees this stream); the blocks handed out under
    // the ones before must not be reached by its work before theirs ran.
    if (!helper) mark = order_mark_.load(std::memory_order_relaxed);
  }
  if (mark != nullptr) wait_behind(s->handle, mark);
}

void DriverBackend::unmark_helper(StreamInfo* s) {
  CUevent mark = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (dead_ || !s->helper.load(std::memory_order_relaxed)) return;
    s->helper.store(false, std::memory_order_relaxed);
    mark = order_mark_.load(std::memory_order_relaxed);
  }
  log_debug("helper stream %p met in a memory call: device fences record on it from now on",
            static_cast<void*>(s->handle));
  if (mark != nullptr) wait_behind(s->handle, mark);
}

void DriverBackend::wait_behind(CUstream s, CUevent e, CUcontext in) {
  CurrentContext current(in != nullptr ? in : ctx_);
  if (driver().cuStreamWaitEvent(s, e, 0) == CUDA_SUCCESS) return;
  log_warn("a non-blocking stream could not wait for the legacy stream's work; the host waits for it instead");
  driver().cuEventSynchronize(e);
}

bool DriverBackend::settle_reuse() { return record_device_fence()->wait(); }

void DriverBackend::add_green(CUcontext green) {
  CUevent mark = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (dead_ || std::find(greens_.begin(), greens_.end(), green) != greens_.end()) return;
    greens_.push_back(green);
    mark = order_mark_.load(std::memory_order_relaxed);
  }
  log_debug("green context %p shares the memory of context %p: device fences record in it too",
            static_cast<void*>(green), static_cast<void*>(ctx_));
  // Blocks handed out under ordering fences so far may still be used by their last owner's
  // legacy-stream work, which the green context's work is not ordered behind.
  if (mark != nullptr) wait_behind(CU_STREAM_LEGACY, mark, green);
}

void DriverBackend::remove_green(CUcontext green) {
  std::lock_guard lock(mutex_);
  std::erase(greens_, green);
  // Its streams outlive it, detached: the driver refuses every call on them (CUDA 12 still
  // takes their destroy), so no fence could record there any more (each one would fall back
  // to a synchronize), and a destroy after this one would not find this state. Their work is done
  // (the caller synchronized the green context).
  std::erase_if(non_blocking_, [green](const StreamInfo* s) { return s->ctx == green; });
}

void DriverBackend::end_ordered_era() {
  if (dead()) return;
  CurrentContext current(ctx_);
  CUevent e = take_event();
  if (e != nullptr && driver().cuEventRecord(e, CU_STREAM_LEGACY) == CUDA_SUCCESS) {
    std::lock_guard lock(mutex_);
    ordered_era_end_ = e;
    return;
  }
  give_event(e);
  // No event: the host waits for the ordered era's work instead, once.
  log_warn("single_stream: no event could be recorded on the legacy stream; synchronizing it");
  if (driver().cuStreamSynchronize(CU_STREAM_LEGACY) != CUDA_SUCCESS) driver().cuCtxSynchronize();
}

void DriverBackend::follow_ordered_era(StreamInfo* s) {
  if (s->kind != StreamInfo::Kind::kCreated || !s->non_blocking || s->ctx != ctx_) return;
  CUevent e = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (dead_) return;
    e = ordered_era_end_;
  }
  if (e != nullptr) wait_behind(s->handle, e);
}

void DriverBackend::remove_stream(StreamInfo* s) {
  {
    std::lock_guard lock(mutex_);
    if (dead_) return;
    auto it = std::find(non_blocking_.begin(), non_blocking_.end(), s);
    if (it == non_blocking_.end()) return;
    non_blocking_.erase(it);
  }
  // cuStreamDestroy returns at once and its queued work still runs: device fences recorded
  // from now on must wait for it. (A capturing stream cannot be destroyed mid-capture.)
  CurrentContext current(ctx_);
  CUevent e = take_event();
  if (e == nullptr || driver().cuEventRecord(e, s->handle) != CUDA_SUCCESS) {
    // Without an event no fence could wait for the stream's queued work any more: wait for it
    // here, before the stream (and with it our view of that work) is gone.
    give_event(e);
    driver().cuStreamSynchronize(s->handle);
    return;
  }
  auto tail = std::make_shared<Tail>(this, e);
  std::lock_guard lock(mutex_);
  tails_.push_back(std::move(tail));
}

std::unique_ptr<Fence> DriverBackend::device_fence_now() {
  if (dead()) return std::make_unique<DoneFence>();
  flush_deferred_frees();
  profile::Scope timed(profile::Site::kFenceRecord);
  CurrentContext current(ctx_);
  auto fence = std::make_unique<EventFence>(this);
  // The legacy stream (whose event also waits for blocking and per-thread streams), every
  // non-blocking stream, with its info, and every green context's legacy stream (recorded with
  // that context current).
  struct Target {
    CUstream stream;
    StreamInfo* info;
    CUcontext in;  // null: this context
  };
  std::vector<Target> targets{{CU_STREAM_LEGACY, nullptr, nullptr}};
  std::vector<std::shared_ptr<Tail>> finished;  // released after the lock: ~Tail takes it
  // The order mark, if there is none yet (it is only set, under the lock, once per context).
  CUevent spare = order_mark_.load(std::memory_order_relaxed) == nullptr ? take_event() : nullptr;
  {
    std::lock_guard lock(mutex_);
    bool independent = false;  // a non-blocking stream not ordered with the legacy one
    for (StreamInfo* s : non_blocking_) {
      targets.push_back(Target{s->handle, s, nullptr});
      independent = independent || !s->helper.load(std::memory_order_relaxed);
    }
    for (CUcontext green : greens_) targets.push_back(Target{CU_STREAM_LEGACY, nullptr, green});
    independent = independent || !greens_.empty();
    for (auto& t : tails_) {
      (t->query() ? finished : fence->tails).push_back(t);
    }
    tails_ = fence->tails;
    // Recorded under the lock, so that a non-blocking stream added meanwhile (add_stream)
    // either ends ordering before this fence or waits for this record. Helper streams' work is
    // joined into their callers' streams, which the legacy event covers.
    if (!independent && fence->tails.empty()) {
      if (order_mark_.load(std::memory_order_relaxed) == nullptr && spare != nullptr) {
        order_mark_.store(spare, std::memory_order_relaxed);
        spare = nullptr;
      }
      CUevent mark = order_mark_.load(std::memory_order_relaxed);
      if (mark != nullptr && driver().cuEventRecord(mark, CU_STREAM_LEGACY) == CUDA_SUCCESS) {
        fence->ordered = true;
        fence->mark = mark;
      }
    }
  }
  give_event(spare);
  if (fence->ordered) return fence;
  CUresult failed = CUDA_SUCCESS;
  // Under the capture lock: a capture that began on one of these streams after the caller's
  // check would be invalidated by the query, and would swallow the event (the context's event
  // would invalidate any capture of the context).
  const bool recorded = captures_.unless_capturing([&] {
    CUevent whole = record_context_event();
    if (whole != nullptr) fence->events.push_back(whole);
    const bool whole_context = whole != nullptr;
    for (const Target& t : targets) {
      // The context's event covers its own streams. The primary context's covers its green
      // contexts' too (documented, and tests/gpu/ctx_event_probe checks a green stream), but
      // those keep events of their own: they are rare, and cost nothing where there are none.
      const bool own = t.in == nullptr && (t.info == nullptr || t.info->ctx == ctx_);
      if (whole_context && own) continue;
      if (t.info != nullptr && stream_idle(*t.info, t.stream)) continue;
      CUevent e = take_event();
      CUresult r = CUDA_ERROR_UNKNOWN;
      if (e != nullptr && t.in != nullptr) {
        CurrentContext green(t.in);
        r = green.ok() ? driver().cuEventRecord(e, t.stream) : CUDA_ERROR_CONTEXT_IS_DESTROYED;
      } else if (e != nullptr) {
        r = driver().cuEventRecord(e, t.stream);
      }
      if (r == CUDA_SUCCESS) {
        fence->events.push_back(e);
        continue;
      }
      give_event(e);
      failed = r;
      return;
    }
  });
  if (!recorded) return std::make_unique<DeferredFence>(this);
  if (failed == CUDA_ERROR_DEINITIALIZED) return std::make_unique<DoneFence>();
  if (failed != CUDA_SUCCESS) {
    log_debug("device fence: cannot record an event (error %d); falling back to a synchronize", failed);
    return std::make_unique<SyncFence>(this);
  }
  return fence;
}

// One event for the work queued on every stream of the context, destroyed streams' included
// (cuCtxRecordEvent, CUDA 12.5): one driver call where the per-stream fence makes one per
// non-blocking stream and the legacy record, and it does not serialize threads the way the
// legacy record does (bench/fence_calls measures both). It waits for the work of legacy,
// per-thread, blocking, non-blocking, destroyed and green contexts' streams, graphs and host
// functions queued before it (tests/gpu/ctx_event_probe checks each). Null, with
// nothing recorded, where the driver lacks or refuses it: the per-stream fence is used from then
// on.
CUevent DriverBackend::record_context_event() {
  if (!context_events_.load(std::memory_order_relaxed) || driver().cuCtxRecordEvent == nullptr) return nullptr;
  CUevent e = take_event();
  if (e == nullptr) return nullptr;
  const CUresult r = driver().cuCtxRecordEvent(ctx_, e);
  if (r == CUDA_SUCCESS) return e;
  give_event(e);
  // For good: a driver that refuses it once (an older one, a context kind it does not take, a
  // capture the tracker did not see, which the call has invalidated) is not asked again.
  if (context_events_.exchange(false, std::memory_order_relaxed)) {
    log_info("device fence: cuCtxRecordEvent refused (error %d); fences record on each stream from now on", r);
  }
  return nullptr;
}

std::unique_ptr<Fence> DriverBackend::record_device_fence() {
  if (dead()) return std::make_unique<DoneFence>();
  if (captures_.any()) return std::make_unique<DeferredFence>(this);
  return device_fence_now();
}

std::unique_ptr<Fence> DriverBackend::record_fence(StreamHandle stream) {
  if (dead()) return std::make_unique<DoneFence>();
  if (stream == kNoStream || captures_.any()) return record_device_fence();
  StreamInfo* info = info_of(stream);
  CUstream handle = nullptr;
  // Another thread's per-thread stream or a destroyed stream: the device fence covers it
  // (destroyed non-blocking streams through their tails).
  if (!driver_handle(info, &handle)) return device_fence_now();
  if (info->kind == StreamInfo::Kind::kCreated && info->ctx != ctx_) return foreign_fence(info->ctx, handle);
  profile::Scope timed(profile::Site::kFenceRecord);
  CurrentContext current(ctx_);
  CUevent e = take_event();
  const CUresult r = e == nullptr ? CUDA_ERROR_UNKNOWN : driver().cuEventRecord(e, handle);
  if (r == CUDA_SUCCESS) {
    auto fence = std::make_unique<EventFence>(this);
    fence->events.push_back(e);
    return fence;
  }
  give_event(e);
  if (r == CUDA_ERROR_DEINITIALIZED) return std::make_unique<DoneFence>();
  return device_fence_now();
}

// This context's device fence does not cover another context's stream: an event there does.
// Without one the host waits for the stream now.
std::unique_ptr<Fence> DriverBackend::foreign_fence(CUcontext ctx, CUstream handle) {
  profile::Scope timed(profile::Site::kFenceRecord);
  CurrentContext current(ctx);
  if (!current.ok()) return std::make_unique<DoneFence>();  // that context is gone, and its work
  CUevent e = nullptr;
  if (driver().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
    if (driver().cuEventRecord(e, handle) == CUDA_SUCCESS) return std::make_unique<ForeignEventFence>(this, e);
    driver().cuEventDestroy_v2(e);
  }
  log_debug("no event could be recorded on stream %p of another context; synchronizing it",
            static_cast<void*>(handle));
  driver().cuStreamSynchronize(handle);
  return std::make_unique<DoneFence>();
}

Status DriverBackend::allocate_segment(std::size_t bytes, DevicePtr* out) {
  *out = 0;
  if (dead()) return refuse(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  flush_deferred_frees();
  profile::Scope timed(profile::Site::kSegmentAlloc);
  CurrentContext current(ctx_);
  RelaxedCaptureMode relaxed(captures_.any());
  CUdeviceptr p = 0;
  const CUresult r = driver().cuMemAlloc_v2(&p, bytes);
  if (r != CUDA_SUCCESS) return to_status(r);
  *out = static_cast<DevicePtr>(p);
  return Status::kOk;
}

void DriverBackend::flush_deferred_frees() {
  std::vector<std::pair<DevicePtr, std::size_t>> frees;
  {
    std::lock_guard lock(mutex_);
    if (deferred_frees_.empty() || captures_.any()) return;
    frees.swap(deferred_frees_);
  }
  free_deferred(frees);  // one deferred again (a capture began meanwhile) is parked again
}

Status DriverBackend::free_segment(DevicePtr ptr, std::size_t bytes) {
  if (dead()) return Status::kOk;
  if (captures_.any()) {
    std::lock_guard lock(mutex_);
    deferred_frees_.emplace_back(ptr, bytes);
    return Status::kDeferred;
  }
  profile::Scope timed(profile::Site::kSegmentFree);
  CurrentContext current(ctx_);
  const CUresult r = driver().cuMemFree_v2(static_cast<CUdeviceptr>(ptr));
  // At exit the driver may be gone already: the memory went with it.
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_DEINITIALIZED) return Status::kOk;
  log_warn("cuMemFree of a segment at 0x%llx failed with error %d", static_cast<unsigned long long>(ptr), r);
  return to_status(r);
}

namespace {
CUmemAllocationProp device_prop(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// Per device, whether its chunks are made with a POSIX file descriptor handle type, so that
// IPC can export them (ipc_export.h). Asked of the device, then tried once: a driver that
// refuses the handle type gets plain chunks from then on. Process-wide (every context of a
// device makes the same chunks) and lock-free (a fork child keeps it).
enum FdChunks : std::uint8_t { kFdUntried, kFdYes, kFdNo };
constexpr int kFdDevices = 64;  // devices beyond this many get plain chunks
std::atomic<std::uint8_t> g_fd_chunks[kFdDevices];

std::uint8_t fd_chunks(CUdevice device) {
  if (device < 0 || device >= kFdDevices) return kFdNo;
  std::uint8_t v = g_fd_chunks[device].load(std::memory_order_relaxed);
  if (v != kFdUntried) return v;
  const DriverApi& d = driver();
  int supported = 0;
  if (d.cuMemExportToShareableHandle == nullptr || d.cuDeviceGetAttribute == nullptr ||
      d.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                             device) != CUDA_SUCCESS ||
      supported == 0) {
    g_fd_chunks[device].store(kFdNo, std::memory_order_relaxed);
    return kFdNo;
  }
  return kFdUntried;  // supported, not yet tried
}
}  // namespace

CUresult DriverBackend::create_chunk(CUmemGenericAllocationHandle* h, std::size_t bytes) {
  const DriverApi& d = driver();
  CUmemAllocationProp prop = device_prop(device_);
  if (fd_chunks(device_) != kFdNo) {
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    const CUresult r = d.cuMemCreate(h, bytes, &prop, 0);
    if (r == CUDA_SUCCESS) g_fd_chunks[device_].store(kFdYes, std::memory_order_relaxed);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_DEINITIALIZED) return r;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    const CUresult plain = d.cuMemCreate(h, bytes, &prop, 0);
    // Only the handle type was refused: never asked for again on this device.
    if (plain == CUDA_SUCCESS && g_fd_chunks[device_].exchange(kFdNo, std::memory_order_relaxed) != kFdNo) {
      log_info("device %d: cuMemCreate refuses POSIX file descriptor handles (error %d); expandable segments "
               "use plain chunks, whose blocks cannot be shared with cuIpcGetMemHandle",
               static_cast<int>(device_), r);
    }
    return plain;
  }
  return d.cuMemCreate(h, bytes, &prop, 0);
}

bool DriverBackend::chunks_exportable() const { return fd_chunks(device_) == kFdYes; }

bool DriverBackend::describe_range(DevicePtr va, std::size_t bytes, std::vector<MappedChunk>* out) const {
  out->clear();
  if (bytes == 0) return false;
  std::lock_guard lock(mutex_);
  auto it = mapped_.upper_bound(va);
  if (it == mapped_.begin()) return false;
  --it;
  DevicePtr at = it->first;
  for (; it != mapped_.end() && it->first == at && at < va + bytes; ++it) {
    out->push_back({it->first, it->second.first});
    at += it->second.first;
  }
  if (at < va + bytes || out->front().va + out->front().bytes <= va) {
    out->clear();
    return false;
  }
  return true;
}

CUresult DriverBackend::export_chunk(DevicePtr va, std::size_t bytes, int* fd) const {
  *fd = -1;
  // Under the lock: an unmap releases the chunk only after taking it out of mapped_.
  std::lock_guard lock(mutex_);
  const auto it = mapped_.find(va);
  if (dead_ || it == mapped_.end() || it->second.first != bytes) return CUDA_ERROR_INVALID_VALUE;
  return driver().cuMemExportToShareableHandle(fd, it->second.second, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
}

bool DriverBackend::supports_virtual_memory() const {
  const DriverApi& d = driver();
  if (!d.cuDeviceGetAttribute || !d.cuMemCreate || !d.cuMemMap || !d.cuMemSetAccess) return false;
  int v = 0;
  return d.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_) ==
             CUDA_SUCCESS && v != 0;
}

std::size_t DriverBackend::vm_granularity() const {
  const CUmemAllocationProp prop = device_prop(device_);
  std::size_t g = 0;
  if (driver().cuMemGetAllocationGranularity == nullptr ||
      driver().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
      g == 0) {
    return 2 * kMiB;
  }
  return g;
}

Status DriverBackend::reserve_address(std::size_t bytes, DevicePtr* out) {
  *out = 0;
  if (dead()) return refuse(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CurrentContext current(ctx_);
  RelaxedCaptureMode relaxed(captures_.any());
  CUdeviceptr p = 0;
  const CUresult r = driver().cuMemAddressReserve(&p, bytes, vm_granularity(), 0, 0);
  if (r != CUDA_SUCCESS) return to_status(r);
  *out = static_cast<DevicePtr>(p);
  return Status::kOk;
}

Status DriverBackend::free_address(DevicePtr base, std::size_t bytes) {
  if (dead()) return Status::kOk;
  CurrentContext current(ctx_);
  RelaxedCaptureMode relaxed(captures_.any());
  const CUresult r = driver().cuMemAddressFree(static_cast<CUdeviceptr>(base), bytes);
  return r == CUDA_ERROR_DEINITIALIZED ? Status::kOk : to_status(r);
}

std::vector<CUmemAccessDesc> DriverBackend::access_locked() const {
  std::vector<CUmemAccessDesc> access(access_devices_.size());
  for (std::size_t i = 0; i < access.size(); ++i) {
    access[i].location = device_prop(access_devices_[i]).location;
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return access;
}

// Maps `h` at [va, va+bytes) with read-write access for this device and its peers; undoes the
// map if the access cannot be set. The caller keeps `h` and holds vm_mutex_.
CUresult DriverBackend::map_handle(DevicePtr va, std::size_t bytes, CUmemGenericAllocationHandle h) {
  const DriverApi& d = driver();
  CUresult r = d.cuMemMap(static_cast<CUdeviceptr>(va), bytes, 0, h, 0);
  if (r != CUDA_SUCCESS) return r;
  const std::vector<CUmemAccessDesc> access = access_locked();
  r = d.cuMemSetAccess(static_cast<CUdeviceptr>(va), bytes, access.data(), access.size());
  if (r != CUDA_SUCCESS) d.cuMemUnmap(static_cast<CUdeviceptr>(va), bytes);
  return r;
}

// What a call that maps new memory holds for its whole length: the virtual-memory lock, its
// profile site, the context current, and relaxed capture mode (so that it never invalidates
// another thread's capture).
struct DriverBackend::MapCall {
  explicit MapCall(DriverBackend& b) : vm(b.vm_mutex_), current(b.ctx_), relaxed(b.captures_.any()) {}
  std::lock_guard<std::mutex> vm;
  profile::Scope timed{profile::Site::kMap};
  CurrentContext current;
  RelaxedCaptureMode relaxed;
};

Status DriverBackend::map(DevicePtr va, std::size_t bytes) {
  if (dead()) return refuse(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  MapCall call(*this);
  const DriverApi& d = driver();
  CUmemGenericAllocationHandle h = 0;
  CUresult r = create_chunk(&h, bytes);
  if (r != CUDA_SUCCESS) return to_status(r);
  r = map_handle(va, bytes, h);
  if (r != CUDA_SUCCESS) {
    d.cuMemRelease(h);
    return to_status(r);
  }
  std::lock_guard lock(mutex_);
  mapped_[va] = {bytes, h};
  return Status::kOk;
}

Status DriverBackend::unmap(DevicePtr va, std::size_t bytes) {
  if (dead()) return Status::kOk;
  std::lock_guard vm(vm_mutex_);
  std::vector<std::pair<DevicePtr, std::pair<std::size_t, CUmemGenericAllocationHandle>>> pieces;
  {
    std::lock_guard lock(mutex_);
    // The range must be covered exactly by earlier map() calls; check before touching any.
    DevicePtr at = va;
    auto it = mapped_.find(va);
    while (it != mapped_.end() && at < va + bytes && it->first == at) {
      at += it->second.first;
      ++it;
    }
    if (at != va + bytes) return Status::kInvalidValue;
    for (auto i = mapped_.find(va); i != it;) {
      pieces.emplace_back(i->first, i->second);
      i = mapped_.erase(i);
    }
  }
  profile::Scope timed(profile::Site::kUnmap);
  const DriverApi& d = driver();
  CurrentContext current(ctx_);
  RelaxedCaptureMode relaxed(captures_.any());  // as map(): never invalidates another thread's capture
  // All or nothing: the allocator keeps a range it could not unmap as mapped memory and hands
  // it out again, so a piece unmapped before another piece failed is mapped back (its handle
  // is still held). Handles are released only once every piece is unmapped.
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const auto& [base, piece] = pieces[i];
    const CUresult r = d.cuMemUnmap(static_cast<CUdeviceptr>(base), piece.first);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_DEINITIALIZED) continue;
    for (std::size_t j = 0; j < i; ++j) {
      const auto& [va_j, piece_j] = pieces[j];
      if (map_handle(va_j, piece_j.first, piece_j.second) != CUDA_SUCCESS) {
        log_error("cuMemUnmap at 0x%llx failed (error %d), and 0x%llx, unmapped before it, could not be mapped back",
                  static_cast<unsigned long long>(base), r, static_cast<unsigned long long>(va_j));
      }
    }
    std::lock_guard lock(mutex_);
    for (const auto& [va_j, piece_j] : pieces) mapped_.emplace(va_j, piece_j);
    return to_status(r);
  }
  for (const auto& [base, piece] : pieces) {
    const CUresult r = d.cuMemRelease(piece.second);
    // Unmapped already: the range is the allocator's to forget, whatever the release says (the
    // physical memory then stays with the driver until the process ends).
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) {
      log_warn("cuMemRelease of the memory unmapped at 0x%llx failed (error %d); its %zu bytes stay allocated",
               static_cast<unsigned long long>(base), r, piece.first);
    }
  }
  return Status::kOk;
}

bool DriverBackend::can_remap() const { return !dead() && supports_virtual_memory() && !captures_.any(); }

// One physical allocation per page, so that remap() can move each page on its own; access is
// set once for the whole range.
Status DriverBackend::map_pages(DevicePtr va, std::size_t bytes, std::size_t page) {
  if (dead()) return refuse(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  MapCall call(*this);
  const DriverApi& d = driver();
  const std::size_t g = page;
  if (g == 0 || g % vm_granularity() != 0 || bytes % g != 0) return Status::kInvalidValue;
  std::vector<std::pair<DevicePtr, CUmemGenericAllocationHandle>> made;
  const auto undo = [&] {
    for (const auto& [p, h] : made) {
      d.cuMemUnmap(static_cast<CUdeviceptr>(p), g);
      d.cuMemRelease(h);
    }
  };
  for (DevicePtr p = va; p < va + bytes; p += g) {
    CUmemGenericAllocationHandle h = 0;
    CUresult r = create_chunk(&h, g);
    if (r == CUDA_SUCCESS) {
      r = d.cuMemMap(static_cast<CUdeviceptr>(p), g, 0, h, 0);
      if (r != CUDA_SUCCESS) d.cuMemRelease(h);
    }
    if (r != CUDA_SUCCESS) {
      undo();
      return to_status(r);
    }
    made.emplace_back(p, h);
  }
  const std::vector<CUmemAccessDesc> access = access_locked();
  if (const CUresult r = d.cuMemSetAccess(static_cast<CUdeviceptr>(va), bytes, access.data(), access.size());
      r != CUDA_SUCCESS) {
    undo();
    return to_status(r);
  }
  std::lock_guard lock(mutex_);
  for (const auto& [p, h] : made) mapped_[p] = {g, h};
  return Status::kOk;
}

Status DriverBackend::remap(const std::vector<DevicePtr>& from, DevicePtr to, std::size_t page) {
  if (!can_remap()) return Status::kBackendError;
  std::lock_guard vm(vm_mutex_);
  const std::size_t g = page;
  if (g == 0 || g % vm_granularity() != 0) return Status::kInvalidValue;
  std::vector<CUmemGenericAllocationHandle> handles;
  {
    std::lock_guard lock(mutex_);
    for (DevicePtr p : from) {
      const auto it = mapped_.find(p);
      if (it == mapped_.end() || it->second.first != g) return Status::kInvalidValue;
      handles.push_back(it->second.second);
    }
  }
  profile::Scope timed(profile::Site::kRemap);
  const DriverApi& d = driver();
  CurrentContext current(ctx_);
  const std::vector<CUmemAccessDesc> access = access_locked();
  // Page by page: unmapped at its old address, mapped at its new one. On a failure the pages
  // already moved go back, so the allocator's view (nothing moved) stays true.
  std::size_t moved = 0;
  CUresult r = CUDA_SUCCESS;
  for (; moved < from.size(); ++moved) {
    const auto dst = static_cast<CUdeviceptr>(to + moved * g);
    r = d.cuMemUnmap(static_cast<CUdeviceptr>(from[moved]), g);
    if (r != CUDA_SUCCESS) break;
    r = d.cuMemMap(dst, g, 0, handles[moved], 0);
    if (r != CUDA_SUCCESS) {
      map_handle(from[moved], g, handles[moved]);
      break;
    }
  }
  if (r == CUDA_SUCCESS) {
    r = d.cuMemSetAccess(static_cast<CUdeviceptr>(to), from.size() * g, access.data(), access.size());
  }
  if (r != CUDA_SUCCESS) {
    for (std::size_t i = 0; i < moved; ++i) {
      d.cuMemUnmap(static_cast<CUdeviceptr>(to + i * g), g);
      if (map_handle(from[i], g, handles[i]) != CUDA_SUCCESS) {
        log_error("a page moved to 0x%llx could not be mapped back at 0x%llx after error %d",
                  static_cast<unsigned long long>(to + i * g), static_cast<unsigned long long>(from[i]), r);
      }
    }
    return to_status(r);
  }
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < from.size(); ++i) {
    mapped_.erase(from[i]);
    mapped_[to + i * g] = {g, handles[i]};
  }
  return Status::kOk;
}

void DriverBackend::grant_peer(CUdevice peer) {
  std::lock_guard vm(vm_mutex_);
  if (std::find(access_devices_.begin(), access_devices_.end(), peer) != access_devices_.end()) return;
  access_devices_.push_back(peer);
  if (dead()) return;
  // Adjacent pieces in one call (each stitched page is a piece of its own); pieces of two
  // reservations that happen to touch may not go in one, so a refused run goes piece by piece.
  std::vector<std::vector<std::pair<DevicePtr, std::size_t>>> runs;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [va, piece] : mapped_) {
      if (runs.empty() || runs.back().back().first + runs.back().back().second != va) runs.emplace_back();
      runs.back().emplace_back(va, piece.first);
    }
  }
  if (runs.empty()) return;
  CurrentContext current(ctx_);
  RelaxedCaptureMode relaxed(captures_.any());
  CUmemAccessDesc access{};
  access.location = device_prop(peer).location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const auto set = [&](DevicePtr va, std::size_t bytes) {
    return driver().cuMemSetAccess(static_cast<CUdeviceptr>(va), bytes, &access, 1);
  };
  std::size_t failed = 0;
  for (const auto& run : runs) {
    const std::size_t bytes = run.back().first + run.back().second - run.front().first;
    if (set(run.front().first, bytes) == CUDA_SUCCESS) continue;
    if (run.size() == 1) {
      ++failed;
      continue;
    }
    for (const auto& [va, piece_bytes] : run) failed += set(va, piece_bytes) != CUDA_SUCCESS;
  }
  log_debug("context %p (device %d): device %d granted access to %zu mapped ranges", static_cast<void*>(ctx_),
            static_cast<int>(device_), static_cast<int>(peer), runs.size());
  if (failed != 0) {
    log_warn("device %d could not be granted access to %zu ranges of device %d's expandable segments",
             static_cast<int>(peer), failed, static_cast<int>(device_));
  }
}

}  // namespace cudalloc::shim
