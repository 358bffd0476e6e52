#include "shim/tracing.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "driver/driver_api.h"
#include "driver/streams.h"
#include "shim/nvtx_injection.h"
#include "support/log.h"
#include "trace/trace_writer.h"

namespace cudalloc::shim {
namespace {

// Never destroyed: hooks may record during exit.
std::atomic<TraceWriter*> g_writer{nullptr};

// What passthrough records need and the driver's calls do not say: a free's size and device,
// and each device's running total (in passthrough, allocated and reserved are the same bytes).
// Kept only while tracing; never destroyed, as the writer.
class PassthroughLedger {
 public:
  struct Entry {
    std::size_t bytes;
    int device;
  };
  // Returns the device's total after the allocation.
  std::size_t allocated(CUdeviceptr ptr, std::size_t bytes, int device) {
    std::lock_guard lock(mutex_);
    live_[ptr] = Entry{bytes, device};
    return totals_[device] += bytes;
  }
  // The freed allocation (bytes 0 if it was made before tracing, or not by the driver), and
  // its device's total after the free.
  Entry freed(CUdeviceptr ptr, int current_device, std::size_t* total) {
    std::lock_guard lock(mutex_);
    Entry e{0, current_device};
    if (auto it = live_.find(ptr); it != live_.end()) {
      e = it->second;
      live_.erase(it);
    }
    std::size_t& t = totals_[e.device];
    t -= std::min(t, e.bytes);
    *total = t;
    return e;
  }
  std::size_t total(int device) {
    std::lock_guard lock(mutex_);
    auto it = totals_.find(device);
    return it == totals_.end() ? 0 : it->second;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<CUdeviceptr, Entry> live_;
  std::map<int, std::size_t> totals_;
};

PassthroughLedger& ledger() {
  static auto* l = new PassthroughLedger;
  return *l;
}

int current_device() {
  CUdevice d = 0;
  const DriverApi& api = driver();
  return api.cuCtxGetDevice != nullptr && api.cuCtxGetDevice(&d) == CUDA_SUCCESS ? static_cast<int>(d) : 0;
}

// The writer's messages (a refused write, the records it lost) in cudalloc's log.
void trace_message(const char* message) noexcept {
  try {
    log_warn("%s", message);
  } catch (...) {
  }
}

void flush_at_exit() {
  if (TraceWriter* w = g_writer.load(std::memory_order_acquire)) w->finish();
}

// The stream as the program names it (docs/trace-format.md): 0x0 for the legacy default stream,
// CU_STREAM_PER_THREAD for a per-thread default stream, else the handle it created. Stream
// records are never freed, so the writer thread may read one after the stream is gone.
std::uint64_t program_stream(StreamHandle key) noexcept {
  const StreamInfo* s = info_of(key);
  if (s == nullptr || s->kind == StreamInfo::Kind::kLegacy) return 0;  // 0: no stream (a cache release)
  return reinterpret_cast<std::uint64_t>(s->handle);
}

}  // namespace

void start_tracing(const Config& config) {
  if (!config.trace_path.empty()) {
    TraceOptions options;
    options.stack_depth = config.trace_stacks;
    options.nvtx = config.trace_nvtx;
    options.phases = true;  // cudalloc_phase_push's phases, with or without NVTX ranges
    options.clock = config.trace_tsc ? TraceClockSource::kTsc : TraceClockSource::kMonotonic;
    options.stream_label = program_stream;
    std::string error;
    TraceWriter::set_message_hook(&trace_message);
    std::unique_ptr<TraceWriter> w = TraceWriter::open(config.trace_path, options, &error);
    if (w == nullptr) {
      log_error("cannot write the trace %s: %s", config.trace_path.c_str(), error.c_str());
    } else {
      log_info("tracing to %s", w->file_path().c_str());
      if (config.trace_nvtx) nvtx_connect_trace();
      // Phases marked through the C API are recorded whether or not NVTX ranges are.
      TraceWriter::set_nvtx_id_hooks(&nvtx_current_range, &nvtx_range_text);
      w->install_fatal_signal_flush();
      g_writer.store(w.release(), std::memory_order_release);
      std::atexit(flush_at_exit);
    }
  }
}

AllocatorObserver* trace_observer() { return g_writer.load(std::memory_order_acquire); }

void trace_passthrough(EventKind kind, CUdeviceptr ptr, std::size_t bytes, CUstream stream, bool async,
                       CUresult result) {
  TraceWriter* w = g_writer.load(std::memory_order_acquire);
  if (w == nullptr) return;
  AllocatorEvent e{};
  e.kind = kind;
  e.async = async;
  e.result = result == CUDA_SUCCESS ? Status::kOk
             : result == CUDA_ERROR_OUT_OF_MEMORY ? Status::kOutOfMemory
             : result == CUDA_ERROR_INVALID_VALUE ? Status::kInvalidValue
                                                  : Status::kBackendError;
  e.stream = async ? reinterpret_cast<StreamHandle>(stream) : kNoStream;
  e.ptr = static_cast<DevicePtr>(ptr);
  e.device = current_device();
  std::size_t total = 0;
  if (result != CUDA_SUCCESS) {
    total = ledger().total(e.device);
  } else if (kind == EventKind::kPassthroughAlloc) {
    total = ledger().allocated(ptr, bytes, e.device);
  } else {
    const auto gone = ledger().freed(ptr, e.device, &total);
    bytes = gone.bytes;
    e.device = gone.device;
  }
  e.requested = bytes;
  e.rounded = bytes;
  e.allocated_after = total;
  e.reserved_after = total;
  w->on_event(e);
}

bool trace_flush_now() {
  TraceWriter* w = g_writer.load(std::memory_order_acquire);
  if (w == nullptr) return false;
  w->flush();
  return true;
}

const std::string* trace_file_path() {
  TraceWriter* w = g_writer.load(std::memory_order_acquire);
  return w == nullptr ? nullptr : &w->file_path();
}

void tracing_after_fork_child() {
  if (TraceWriter* w = g_writer.load(std::memory_order_acquire)) w->after_fork_child();
}

}  // namespace cudalloc::shim
