#include "driver/context_state.h"

#include <algorithm>

#include "allocator/memory_stats.h"
#include "allocator/size_classes.h"

#include "driver/current_context.h"
#include "driver/driver_api.h"
#include "support/log.h"

namespace cudalloc::shim {

ContextState::ContextState(CUcontext c, CUdevice dev, const AllocatorOptions& options, CaptureTracker& captures,
                           HostBudget& host_budget, LiveDeviceFences& contexts, SubmissionWatch* watch)
    : ctx(c),
      device(dev),
      backend(c, dev, captures, watch),
      allocator(backend, options, static_cast<int>(dev)),
      host_backend(c, captures, contexts),
      host(host_backend, host_budget, static_cast<int>(dev)) {}

CUDALLOC_HOT ContextState* ContextRegistry::current(StreamInfo** stream) {
  CUcontext ctx = nullptr;
  if (driver().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return nullptr;
  return get(ctx, stream);
}

StreamInfo* ContextRegistry::default_of_slow(StreamInfo* stream) {
  CUcontext ctx = nullptr;
  if (driver().cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr) find(ctx, &stream);
  return stream;
}

ContextState* ContextRegistry::make(CUcontext ctx) {
  ContextState* state = nullptr;
  bool several = false;
  {
    std::lock_guard lock(mutex_);
    if (ContextState* s = find(ctx)) return s;
    CUdevice dev = 0;
    {
      // A context the driver no longer knows (a stream of a destroyed one) gets no state.
      CurrentContext current(ctx);
      if (!current.ok() || driver().cuCtxGetDevice(&dev) != CUDA_SUCCESS) return nullptr;
    }
    // Never freed: other threads may still hold it, and nothing is given back at exit.
    state = new ContextState(ctx, dev, options_, captures_, host_budget_, *this, watch_);
    state->allocator.set_observer(observers_.device != nullptr ? observers_.device() : nullptr);
    state->host.set_observer(observers_.host != nullptr ? observers_.host() : nullptr);
    state->host.set_reclaimer([this] { return release_host_caches(); });
    std::shared_ptr<DeviceBudget>& budget = budgets_[dev];
    if (budget == nullptr) budget = std::make_shared<DeviceBudget>();
    state->allocator.share_budget(budget);
    state->allocator.set_reclaimer([this, state] { return release_others(*state); });
    // Before it is published: no allocation of it may miss a limit set through the API.
    if (auto it = limits_.find(dev); it != limits_.end()) apply_limit(*state, it->second);
    // Nothing is mapped yet: this only records them for its maps.
    if (auto it = peers_.find(dev); it != peers_.end()) {
      for (CUdevice peer : it->second) state->backend.grant_peer(peer);
    }
    auto* next = new ContextList{*snapshot_.load(std::memory_order_acquire)};
    next->states.push_back(state);
    several = next->states.size() > 1;
    publish_locked(next);
    log_debug("context %p (device %d): new allocator", static_cast<void*>(ctx), static_cast<int>(dev));
    // per_process_memory_fraction is known in bytes only here, with the device's memory: a limit
    // below the smallest segment fails every allocation, which a warning at start-up explains.
    if (const std::size_t limit = state->allocator.memory_limit(); limit < kSmallBuffer && small_limit_warned_.insert(dev).second) {
      log_warn("the memory limit on device %d is %s (per_process_memory_fraction=%g, memory_limit_mb=%zu), below "
               "the smallest segment (%s): every allocation will fail with CUDA_ERROR_OUT_OF_MEMORY",
               static_cast<int>(dev), format_bytes(limit).c_str(), options_.per_process_memory_fraction,
               options_.memory_limit_bytes / kMiB, format_bytes(kSmallBuffer).c_str());
    }
    if (state->allocator.expandable_ignored() && vm_warned_.insert(dev).second) {
      log_warn("expandable_segments is ignored on device %d: it has no virtual memory management "
               "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0, or the driver lacks its calls), "
               "so its allocations use plain segments",
               static_cast<int>(dev));
    }
  }
  // Work of two contexts is not ordered on one legacy stream (and with peer access a block
  // may be used from the other).
  if (several) single_stream_.leave(*this, "a second context");
  return state;
}

// Other contexts of the device may hold what a request of `s` lacks idle in their caches: the
// device's memory, or the room under a limit they share. Gives that back (waiting for their
// pending frees, as an out-of-memory path may). Called by `s`'s allocator with none of its
// locks held (set_reclaimer).
bool ContextRegistry::release_others(const ContextState& s) {
  std::size_t released = 0;
  for (ContextState* other : live()) {
    if (other == &s || other->device != s.device || other->allocator.cached_bytes() == 0) continue;
    released += other->allocator.release_cached();
  }
  if (device_reclaimer_) released += device_reclaimer_(s.device);
  if (released != 0) {
    log_info("out of memory on device %d: %zu bytes released from the device's other caches; retrying",
             static_cast<int>(s.device), released);
  }
  return released != 0;
}

bool ContextRegistry::release_host_caches() {
  std::size_t released = 0;
  for (ContextState* s : live()) released += s->host.release_cached(true);
  if (released != 0) log_info("pinned host memory short: %zu cached bytes given back; retrying", released);
  return released != 0;
}

CUDALLOC_HOT ContextState* ContextRegistry::owner(CUdeviceptr p) const {
  for (ContextState* s : live()) {
    if (s->allocator.owns(static_cast<DevicePtr>(p))) return s;
  }
  return nullptr;
}

// The limit as AllocatorOptions' fraction and cap make it (DeviceAllocator's limit()).
void ContextRegistry::apply_limit(ContextState& s, LimitSetting setting) {
  const std::size_t total = s.backend.total_memory();
  std::size_t limit = total;
  if (setting.fraction < 1.0) limit = static_cast<std::size_t>(static_cast<double>(total) * setting.fraction);
  if (setting.bytes != 0) limit = std::min(limit, setting.bytes);
  // 0 would mean "back to the configured limit" to the allocator.
  s.allocator.set_memory_limit(std::max<std::size_t>(limit, 1));
}

void ContextRegistry::set_limit(CUdevice dev, LimitSetting setting) {
  std::lock_guard lock(mutex_);
  limits_[dev] = setting;
  for (ContextState* s : live()) {
    if (s->device == dev) apply_limit(*s, setting);
  }
}

ContextRegistry::LimitSetting ContextRegistry::limit_setting(CUdevice dev) {
  std::lock_guard lock(mutex_);
  if (auto it = limits_.find(dev); it != limits_.end()) return it->second;
  return LimitSetting{options_.per_process_memory_fraction, options_.memory_limit_bytes};
}

void ContextRegistry::end_ordered_eras() {
  for (ContextState* s : live()) s->backend.end_ordered_era();
}

void ContextRegistry::record_device_fences(std::vector<std::unique_ptr<Fence>>& out) {
  for (ContextState* s : live()) out.push_back(s->backend.record_device_fence());
}

bool ContextRegistry::is_live(const ContextState* s) const {
  const auto& v = live();
  return std::find(v.begin(), v.end(), s) != v.end();
}

CUDALLOC_NOINLINE ContextState* ContextRegistry::in_green(const ContextList::Alias& a, StreamInfo** stream) {
  if (stream != nullptr && *stream != nullptr) {
    StreamInfo* s = *stream;
    if (s->kind == StreamInfo::Kind::kLegacy) *stream = a.legacy;
    // A green context has no per-thread default stream: the driver refuses every call that
    // names it (CUDA_ERROR_INVALID_HANDLE, as driver 580 answers).
    if (s->kind == StreamInfo::Kind::kPerThread) *stream = nullptr;
  }
  return a.state;
}

void ContextRegistry::alias(CUcontext green, ContextState* primary) {
  {
    std::lock_guard lock(mutex_);
    auto* next = new ContextList{*snapshot_.load(std::memory_order_acquire)};  // the old one is leaked
    for (const ContextList::Alias& a : next->aliases) {
      if (a.green == green) a.legacy->alive.store(false, std::memory_order_release);
    }
    std::erase_if(next->aliases, [green](const auto& a) { return a.green == green; });
    // Never freed, as every StreamInfo: keys stay unique.
    auto* legacy = new StreamInfo{StreamInfo::Kind::kCreated, CU_STREAM_LEGACY, green, false, {true}};
    next->aliases.push_back(ContextList::Alias{green, primary, legacy});
    publish_locked(next);
  }
  // Its work is not ordered with the primary context's legacy stream.
  single_stream_.leave(*this, "a green context");
}

void ContextRegistry::unalias(CUcontext green) {
  std::lock_guard lock(mutex_);
  auto* next = new ContextList{*snapshot_.load(std::memory_order_acquire)};
  for (const ContextList::Alias& a : next->aliases) {
    if (a.green == green) a.legacy->alive.store(false, std::memory_order_release);
  }
  std::erase_if(next->aliases, [green](const auto& a) { return a.green == green; });
  publish_locked(next);
}

std::vector<ParkedFree> ContextRegistry::drop(CUcontext ctx) {
  ContextState* state = nullptr;
  {
    std::lock_guard lock(mutex_);
    // Its own state only: a green context's end (or a cuCtxDestroy the driver refuses for
    // one) leaves the primary context's state alone.
    for (ContextState* s : live()) {
      if (s->ctx == ctx) state = s;
    }
    if (state == nullptr) return {};
    auto* next = new ContextList{*snapshot_.load(std::memory_order_acquire)};
    std::erase(next->states, state);
    for (const ContextList::Alias& a : next->aliases) {
      if (a.state == state) a.legacy->alive.store(false, std::memory_order_release);
    }
    std::erase_if(next->aliases, [state](const auto& a) { return a.state == state; });
    publish_locked(next);
  }
  state->backend.mark_dead();
  state->allocator.forget_all();
  state->host.forget_all();
  log_debug("context %p gone: its cached blocks are forgotten", static_cast<void*>(ctx));
  return captures_.drop_owner(state, ctx);
}

void ContextRegistry::grant_peer(CUdevice owner, CUdevice peer) {
  if (owner == peer) return;
  std::vector<ContextState*> states;
  {
    // Under the lock that make() holds: a context made meanwhile is either listed here or
    // reads the new peer.
    std::lock_guard lock(mutex_);
    if (!peers_[owner].insert(peer).second) return;
    for (ContextState* s : live()) {
      if (s->device == owner) states.push_back(s);
    }
  }
  for (ContextState* s : states) s->backend.grant_peer(peer);
}

}  // namespace cudalloc::shim
