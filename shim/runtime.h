// The shim's process-wide state, made at the first intercepted CUDA call (never in a
// constructor: a process that never touches CUDA must not be changed by the preload).
#pragma once

#include <atomic>

#include "config/config.h"
#include "driver/capture.h"
#include "driver/context_state.h"
#include "driver/single_stream.h"
#include "driver/streams.h"
#include "driver/vmm_cache.h"
#include "support/profile.h"

namespace cudalloc::shim {

// Whole cache lines (every cudaFree reads config.free_sync): a heap neighbour's writes never
// evict it.
struct alignas(64) Runtime {
  Config config;
  bool passthrough = false;
};

// First call: reads the configuration (a bad one prints one line and exits with status 1,
// before any CUDA work), logs it, registers the fork handler.
const Runtime& runtime();

// What caching keeps about the process. A fork child gets a fresh one.
struct ProcessState {
  explicit ProcessState(const Config& config);
  CaptureTracker captures;
  StreamRegistry streams;
  SingleStreamMode single_stream;
  ContextRegistry contexts;
  VmmCache vmm{contexts};  // the program's own virtual memory (cuMemCreate ...)
};

namespace detail {
// Heap objects that are never destroyed: hooks run during exit too.
extern std::atomic<const Runtime*> g_runtime;
extern std::atomic<ProcessState*> g_state;
extern std::atomic<bool> g_state_due;  // a fork child's fresh state is made at its first call
ProcessState* caching_state_first();
ProcessState* caching_state_after_fork();
}  // namespace detail

// The caching state; null in passthrough mode. Inline once initialized: every hook asks.
inline ProcessState* caching_state() {
  if (detail::g_runtime.load(std::memory_order_acquire) == nullptr) [[unlikely]] return detail::caching_state_first();
  ProcessState* s = detail::g_state.load(std::memory_order_acquire);
  if (s == nullptr && detail::g_state_due.load(std::memory_order_acquire)) [[unlikely]] {
    return detail::caching_state_after_fork();
  }
  return s;
}

// The caching state when the hooks' hot paths may run: initialized, caching, CUDALLOC_PROFILE
// off (known to be). Else null, and the hook takes its general path, which handles all.
inline ProcessState* hot_state() {
  if (profile::detail::g_enabled.load(std::memory_order_relaxed) != 0) [[unlikely]] return nullptr;
  if (detail::g_runtime.load(std::memory_order_acquire) == nullptr) [[unlikely]] return nullptr;
  return detail::g_state.load(std::memory_order_acquire);
}
// Whether cudaFree blocks (free_sync:true). After hot_state() has returned a state.
inline bool free_sync_hot() { return detail::g_runtime.load(std::memory_order_relaxed)->config.free_sync; }

}  // namespace cudalloc::shim
