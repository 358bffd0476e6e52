// NVTX phases for the trace (trace_nvtx:true): libcudalloc.so is also an NVTX injection library.
//
// At load time, when CUDALLOC_TRACE is set and CUDALLOC_CONF has trace_nvtx:true, the library
// points NVTX_INJECTION64_PATH at itself unless the variable is already set (compute-sanitizer
// and Nsight set it to their own library; that is left alone and NVTX phases are off). The
// program's NVTX code then calls InitializeInjectionNvtx2, which installs range push/pop
// callbacks that keep a per-thread range stack. Each distinct stack (outermost first, joined
// with '/') is interned once, on push, as a 32-bit id; an allocation only reads the calling
// thread's current id, and the trace writer's thread turns ids into text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cudalloc::shim {

// From start_tracing when trace_nvtx is on: connects the trace writer to the range
// stacks, or logs (info) why NVTX phases stay off.
void nvtx_connect_trace();

// The calling thread's innermost tracked range stack as an id, or else the process's current
// phase (phase_push), 0 when neither. A thread-local read and a relaxed atomic load only.
std::uint32_t nvtx_current_range() noexcept;

// The C API's phase markers (cudalloc_phase_push/pop): one stack for the process, interned
// with the range stacks, so that traced records show "forward/attn" as NVTX phases. Phases are
// recorded whenever tracing is on, with or without trace_nvtx. pop: false when none is open.
bool phase_push(std::string_view name);
bool phase_pop();

// The text of a range-stack id ("forward/attn", at most TraceWriter::kMaxNvtx bytes, not
// NUL-terminated) and its length; 0 for an unknown id. Lock-free, no allocation.
std::size_t nvtx_range_text(std::uint32_t id, const char** text) noexcept;

}  // namespace cudalloc::shim
