// The C API of include/cudalloc/cudalloc.h: what a program asks cudalloc while it runs.
//
// Nothing here is on the allocation path: statistics are read as CUDALLOC_STATS reads them at
// exit (each allocator's stats(), under its lock, merging the thread caches' counts), and the
// cache and limit calls take the paths cudaMemPoolTrimTo and the configuration take.
#include "include/cudalloc/cudalloc.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/memory_stats.h"
#include "driver/cuda_api.h"
#include "driver/driver_api.h"
#include "shim/nvtx_injection.h"
#include "shim/runtime.h"
#include "shim/tracing.h"

#ifndef CUDALLOC_VERSION_STRING
#error "CUDALLOC_VERSION_STRING is set by meson from the project version"
#endif

namespace cudalloc::shim {
namespace {

// The statistic names, in a fixed order for the life of the process (cudalloc_stat_name).
const std::vector<std::string>& stat_names() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string>;  // never destroyed: calls may come during exit
    for (const auto& [key, value] : MemoryStats{}.to_map()) v->push_back(key);
    return v;
  }();
  return *names;
}

void add(Stat& into, const Stat& s) {
  into.current += s.current;
  into.peak += s.peak;
  into.allocated += s.allocated;
  into.freed += s.freed;
}

void add(StatArray& into, const StatArray& a) {
  for (std::size_t i = 0; i < a.size(); ++i) add(into[i], a[i]);
}

void add(MemoryStats& into, const MemoryStats& s) {
  add(into.allocation, s.allocation);
  add(into.segment, s.segment);
  add(into.active, s.active);
  add(into.inactive_split, s.inactive_split);
  add(into.allocated_bytes, s.allocated_bytes);
  add(into.reserved_bytes, s.reserved_bytes);
  add(into.active_bytes, s.active_bytes);
  add(into.inactive_split_bytes, s.inactive_split_bytes);
  add(into.requested_bytes, s.requested_bytes);
  into.num_alloc_retries += s.num_alloc_retries;
  into.num_ooms += s.num_ooms;
  into.num_pending_waits += s.num_pending_waits;
  into.num_device_alloc += s.num_device_alloc;
  into.num_device_free += s.num_device_free;
  into.num_cache_hits += s.num_cache_hits;
  into.num_cache_misses += s.num_cache_misses;
  into.num_locked_allocs += s.num_locked_allocs;
  into.num_locked_frees += s.num_locked_frees;
  into.num_bridged_allocs += s.num_bridged_allocs;
  into.oversize_allocations += s.oversize_allocations;
  into.oversize_segments += s.oversize_segments;
}

// The caching state for an API call: initialises the runtime if no CUDA call has yet (as the
// first one would), null in passthrough mode.
ProcessState* state_for_api() { return caching_state(); }

// The device a call names: CUDALLOC_CURRENT_DEVICE is the calling thread's current context's
// (0 without one, as PyTorch's current device). An ordinal the driver says does not exist is
// refused; before CUDA is initialised any ordinal is taken (it holds nothing).
int resolve_device(int device, bool allow_all, int* out) {
  const DriverApi* api = driver_if_loaded();
  if (device == CUDALLOC_ALL_DEVICES && allow_all) {
    *out = device;
    return CUDALLOC_OK;
  }
  if (device == CUDALLOC_CURRENT_DEVICE) {
    CUdevice d = 0;
    *out = api != nullptr && api->cuCtxGetDevice != nullptr && api->cuCtxGetDevice(&d) == CUDA_SUCCESS
               ? static_cast<int>(d)
               : 0;
    return CUDALLOC_OK;
  }
  if (device < 0) return CUDALLOC_ERROR_INVALID_DEVICE;
  int count = 0;
  if (api != nullptr && api->cuDeviceGetCount != nullptr && api->cuDeviceGetCount(&count) == CUDA_SUCCESS &&
      device >= count) {
    return CUDALLOC_ERROR_INVALID_DEVICE;
  }
  *out = device;
  return CUDALLOC_OK;
}

bool on_device(const ContextState* s, int device) {
  return device == CUDALLOC_ALL_DEVICES || static_cast<int>(s->device) == device;
}

// The device's statistics: its contexts' together. `note` gets the summary's extra line.
MemoryStats device_stats(ProcessState& ps, int device, std::string* note = nullptr) {
  MemoryStats total;
  for (ContextState* s : ps.contexts.live()) {
    if (!on_device(s, device)) continue;
    add(total, s->allocator.stats());
    if (note != nullptr && s->allocator.expandable_ignored()) {
      *note = "expandable_segments ignored: the device has no virtual memory management";
    }
  }
  return total;
}

// Copies `text` as snprintf would.
void fill(std::string_view text, char* buf, std::size_t size, std::size_t* length) {
  if (length != nullptr) *length = text.size();
  if (buf == nullptr || size == 0) return;
  const std::size_t n = std::min(text.size(), size - 1);
  std::memcpy(buf, text.data(), n);
  buf[n] = '\0';
}

// The device's size from the driver; 0 when CUDA is not initialised.
std::size_t device_total(int device) {
  const DriverApi* api = driver_if_loaded();
  std::size_t total = 0;
  if (api == nullptr || api->cuDeviceTotalMem_v2 == nullptr ||
      api->cuDeviceTotalMem_v2(&total, static_cast<CUdevice>(device)) != CUDA_SUCCESS) {
    return 0;
  }
  return total;
}

}  // namespace
}  // namespace cudalloc::shim

using namespace cudalloc::shim;
using cudalloc::MemoryStats;

CUDALLOC_EXPORT int cudalloc_api_version(void) { return CUDALLOC_API_VERSION; }

CUDALLOC_EXPORT const char* cudalloc_version(void) { return CUDALLOC_VERSION_STRING; }

CUDALLOC_EXPORT const char* cudalloc_status_string(int status) {
  switch (status) {
    case CUDALLOC_OK: return "success";
    case CUDALLOC_ERROR_NOT_LOADED: return "cudalloc is not loaded in this process";
    case CUDALLOC_ERROR_PASSTHROUGH: return "caching is off (passthrough mode): cudalloc keeps no figures";
    case CUDALLOC_ERROR_INVALID_DEVICE: return "no such device";
    case CUDALLOC_ERROR_INVALID_VALUE: return "invalid value";
    case CUDALLOC_ERROR_UNKNOWN_KEY: return "no statistic of that name";
    case CUDALLOC_ERROR_NOT_TRACING: return "not tracing (CUDALLOC_TRACE is not set)";
    case CUDALLOC_ERROR_NOT_INITIALIZED: return "CUDA is not initialised in this process yet";
    case CUDALLOC_ERROR_NO_PHASE: return "no phase is open";
    default: return "unknown status";
  }
}

CUDALLOC_EXPORT size_t cudalloc_stat_count(void) { return stat_names().size(); }

CUDALLOC_EXPORT const char* cudalloc_stat_name(size_t index) {
  const auto& names = stat_names();
  return index < names.size() ? names[index].c_str() : nullptr;
}

CUDALLOC_EXPORT int cudalloc_stats(int device, int64_t* values, size_t capacity) {
  if (values == nullptr && capacity != 0) return CUDALLOC_ERROR_INVALID_VALUE;
  int dev = 0;
  if (const int r = resolve_device(device, false, &dev); r != CUDALLOC_OK) return r;
  ProcessState* ps = state_for_api();
  if (ps == nullptr) return CUDALLOC_ERROR_PASSTHROUGH;
  try {
    const auto map = device_stats(*ps, dev).to_map();
    const auto& names = stat_names();
    for (std::size_t i = 0; i < capacity && i < names.size(); ++i) {
      auto it = map.find(names[i]);
      values[i] = it == map.end() ? 0 : it->second;
    }
  } catch (...) {
    return CUDALLOC_ERROR_INVALID_VALUE;
  }
  return CUDALLOC_OK;
}

CUDALLOC_EXPORT int cudalloc_stat(int device, const char* key, int64_t* value) {
  if (key == nullptr || value == nullptr) return CUDALLOC_ERROR_INVALID_VALUE;
  const auto& names = stat_names();
  const auto it = std::find(names.begin(), names.end(), std::string_view(key));
  if (it == names.end()) return CUDALLOC_ERROR_UNKNOWN_KEY;
  std::vector<int64_t> values(names.size());
  if (const int r = cudalloc_stats(device, values.data(), values.size()); r != CUDALLOC_OK) return r;
  *value = values[static_cast<std::size_t>(it - names.begin())];
  return CUDALLOC_OK;
}

CUDALLOC_EXPORT int cudalloc_memory_summary(int device, char* buf, size_t size, size_t* length) {
  if (buf == nullptr && size != 0) return CUDALLOC_ERROR_INVALID_VALUE;
  int dev = 0;
  if (const int r = resolve_device(device, false, &dev); r != CUDALLOC_OK) return r;
  ProcessState* ps = state_for_api();
  if (ps == nullptr) return CUDALLOC_ERROR_PASSTHROUGH;
  try {
    std::string note;
    const MemoryStats s = device_stats(*ps, dev, &note);
    std::size_t limit = 0;
    for (ContextState* c : ps->contexts.live()) {
      if (on_device(c, dev)) limit = c->allocator.memory_limit();
    }
    fill(cudalloc::format_memory_summary(s, dev, limit, note), buf, size, length);
  } catch (...) {
    return CUDALLOC_ERROR_INVALID_VALUE;
  }
  return CUDALLOC_OK;
}

CUDALLOC_EXPORT int cudalloc_reset_peak_memory_stats(int device) {
  int dev = 0;
  if (const int r = resolve_device(device, true, &dev); r != CUDALLOC_OK) return r;
  ProcessState* ps = state_for_api();
  if (ps == nullptr) return CUDALLOC_ERROR_PASSTHROUGH;
  for (ContextState* s : ps->contexts.live()) {
    if (on_device(s, dev)) s->allocator.reset_peak_stats();
  }
  return CUDALLOC_OK;
}

// The path cudaMemPoolTrimTo(pool, 0) takes for the device's pool (hooks_memory.cpp).
CUDALLOC_EXPORT int cudalloc_empty_cache(int device, size_t* released) {
  int dev = 0;
  if (const int r = resolve_device(device, true, &dev); r != CUDALLOC_OK) return r;
  ProcessState* ps = state_for_api();
  if (ps == nullptr) return CUDALLOC_ERROR_PASSTHROUGH;
  std::size_t total = 0;
  for (ContextState* s : ps->contexts.live()) {
    if (on_device(s, dev)) total += s->allocator.release_cached(0);
  }
  total += ps->vmm.release_cached(dev);
  if (released != nullptr) *released = total;
  return CUDALLOC_OK;
}

CUDALLOC_EXPORT int cudalloc_set_memory_fraction(int device, double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) return CUDALLOC_ERROR_INVALID_VALUE;  // NaN too
  int dev = 0;
  if (const int r = resolve_device(device, false, &dev); r != CUDALLOC_OK) return r;
  ProcessState* ps = state_for_api();
  if (ps == nullptr) return CUDALLOC_ERROR_PASSTHROUGH;
  auto setting = ps->contexts.limit_setting(dev);
  setting.fraction = fraction;
  ps->contexts.set_limit(dev, setting);
  return CUDALLOC_OK;
}

CUDALLOC_EXPORT int cudalloc_get_memory_fraction(int device, double* fraction) {
  if (fraction == nullptr) return CUDALLOC_ERROR_INVALID_VALUE;
  int dev = 0;
  if (const int r = resolve_device(device, false, &dev); r != CUDALLOC_OK) return r;
  ProcessState* ps = state_for_api();
  if (ps == nullptr) return CUDALLOC_ERROR_PASSTHROUGH;
  *fraction = ps->contexts.limit_setting(dev).fraction;
  return CUDALLOC_OK;
}

CUDALLOC_EXPORT int cudalloc_set_memory_limit(int device, size_t bytes) {
  int dev = 0;
  if (const int r = resolve_device(device, false, &dev); r != CUDALLOC_OK) return r;
  ProcessState* ps = state_for_api();
  if (ps == nullptr) return CUDALLOC_ERROR_PASSTHROUGH;
  auto setting = ps->contexts.limit_setting(dev);
  setting.bytes = bytes;
  ps->contexts.set_limit(dev, setting);
  return CUDALLOC_OK;
}

CUDALLOC_EXPORT int cudalloc_get_memory_limit(int device, size_t* bytes) {
  if (bytes == nullptr) return CUDALLOC_ERROR_INVALID_VALUE;
  int dev = 0;
  if (const int r = resolve_device(device, false, &dev); r != CUDALLOC_OK) return r;
  ProcessState* ps = state_for_api();
  if (ps == nullptr) return CUDALLOC_ERROR_PASSTHROUGH;
  for (ContextState* s : ps->contexts.live()) {
    if (on_device(s, dev)) {
      *bytes = s->allocator.memory_limit();
      return CUDALLOC_OK;
    }
  }
  // No allocator on the device yet: the limit it will get (apply_limit's rule).
  const std::size_t total = device_total(dev);
  if (total == 0) return CUDALLOC_ERROR_NOT_INITIALIZED;
  const auto setting = ps->contexts.limit_setting(dev);
  std::size_t limit = total;
  if (setting.fraction < 1.0) limit = static_cast<std::size_t>(static_cast<double>(total) * setting.fraction);
  if (setting.bytes != 0) limit = std::min(limit, setting.bytes);
  *bytes = limit;
  return CUDALLOC_OK;
}

CUDALLOC_EXPORT int cudalloc_trace_flush(void) {
  (void)runtime();  // the trace is opened with the runtime
  return trace_flush_now() ? CUDALLOC_OK : CUDALLOC_ERROR_NOT_TRACING;
}

CUDALLOC_EXPORT int cudalloc_trace_path(char* buf, size_t size, size_t* length) {
  if (buf == nullptr && size != 0) return CUDALLOC_ERROR_INVALID_VALUE;
  (void)runtime();
  const std::string* path = trace_file_path();
  if (path == nullptr) return CUDALLOC_ERROR_NOT_TRACING;
  fill(*path, buf, size, length);
  return CUDALLOC_OK;
}

CUDALLOC_EXPORT int cudalloc_phase_push(const char* name) {
  if (name == nullptr) return CUDALLOC_ERROR_INVALID_VALUE;
  return phase_push(name) ? CUDALLOC_OK : CUDALLOC_ERROR_INVALID_VALUE;
}

CUDALLOC_EXPORT int cudalloc_phase_pop(void) { return phase_pop() ? CUDALLOC_OK : CUDALLOC_ERROR_NO_PHASE; }
