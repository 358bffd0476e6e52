// The process's allocation trace (CUDALLOC_TRACE), set up with the runtime at the first
// intercepted CUDA call.
#pragma once

#include <cstddef>
#include <string>

#include "allocator/events.h"
#include "config/config.h"
#include "driver/cuda_api.h"

namespace cudalloc::shim {

// Opens the trace writer if the configuration asks for one and registers its exit handler.
void start_tracing(const Config& config);

// The observer every allocator reports to; null when not tracing.
AllocatorObserver* trace_observer();

// Records a call that went straight to the driver (passthrough mode).
void trace_passthrough(EventKind kind, CUdeviceptr ptr, std::size_t bytes, CUstream stream, bool async,
                       CUresult result);

// cudalloc_trace_flush: writes the queued records now; false when not tracing.
bool trace_flush_now();
// The file the trace goes to; null when not tracing.
const std::string* trace_file_path();

// The fork child writes its own trace file.
void tracing_after_fork_child();

}  // namespace cudalloc::shim
