// Stream and capture calls: the shim learns the process's streams (a device fence must
// record on every non-blocking one) and which streams are being captured.
#include "driver/helper_streams.h"
#include "shim/free_path.h"
#include "shim/hooks.h"
#include "shim/runtime.h"
#include "support/log.h"

using namespace cudalloc;
using namespace cudalloc::shim;

namespace {

// `caller`: where the stream call returns to, to tell a library's helper streams apart
// (helper_streams.h); nullptr when the program's own. `in`: the stream's context, when it is
// not the current one (a green context's stream).
CUresult stream_created(CUresult r, CUstream* stream, unsigned flags, const void* caller = nullptr,
                        CUcontext in = nullptr) {
  ProcessState* ps = caching_state();
  if (ps == nullptr || r != CUDA_SUCCESS || stream == nullptr) return r;
  CUcontext ctx = in;
  if (ctx == nullptr) driver().cuCtxGetCurrent(&ctx);
  log_debug("stream %p created in context %p, flags %#x", static_cast<void*>(*stream), static_cast<void*>(ctx), flags);
  StreamInfo* si = ps->streams.created(*stream, ctx, flags);
  if (ContextState* s = ps->contexts.get(ctx)) {
    // A blocking stream keeps single_stream on, and device fences ordering reuse: the legacy
    // stream orders against it both ways. So does a library's helper stream, which the library
    // orders with its caller's stream. Either one's first use in a memory call still ends the
    // mode (hooks_memory.cpp).
    const bool non_blocking = (flags & CU_STREAM_NON_BLOCKING) != 0;
    const char* lib = non_blocking ? helper_stream_library(caller) : nullptr;
    s->backend.add_stream(si, lib != nullptr);
    if (non_blocking) {
      if (lib != nullptr) {
        log_debug("stream %p is a helper stream of %s, ordered with its caller's stream", static_cast<void*>(*stream), lib);
      } else {
        ps->single_stream.stream_seen(ps->contexts, s->backend, si, "a non-blocking stream was created");
      }
    }
  }
  return r;
}

CUresult stream_destroy(CUresult (*real)(CUstream), CUstream stream) {
  ProcessState* ps = caching_state();
  if (ps != nullptr && stream != nullptr && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD) {
    if (StreamInfo* si = ps->streams.destroyed(stream); si != nullptr && si->non_blocking) {
      if (ContextState* s = ps->contexts.find(si->ctx)) s->backend.remove_stream(si);
    }
  }
  return real(stream);
}

// Registered before the driver call: from that moment no fence may be recorded on it.
template <typename Call>
CUresult begin_capture(CUstream stream, bool ptsz, Call&& call) {
  ProcessState* ps = caching_state();
  if (ps == nullptr) return call();
  StreamInfo* si = ps->streams.resolve(stream, ptsz);
  ps->single_stream.leave(ps->contexts, "a stream capture began");
  ps->captures.begin(si);
  const CUresult r = call();
  if (r != CUDA_SUCCESS) run_parked(*ps, ps->captures.end(si));
  return r;
}

CUresult end_capture(CUresult (*real)(CUstream, CUgraph*), CUstream stream, CUgraph* graph, bool ptsz) {
  ProcessState* ps = caching_state();
  const CUresult r = real(stream, graph);
  if (ps == nullptr) return r;
  // A failed end (wrong thread, say) may leave the capture on: ask before forgetting it.
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  auto* is_capturing = ptsz ? driver().cuStreamIsCapturing_ptsz : driver().cuStreamIsCapturing;
  if (r != CUDA_SUCCESS && is_capturing != nullptr && is_capturing(stream, &status) == CUDA_SUCCESS &&
      status != CU_STREAM_CAPTURE_STATUS_NONE) {
    return r;
  }
  run_parked(*ps, ps->captures.end(ps->streams.resolve(stream, ptsz)));
  return r;
}

}  // namespace

CUDALLOC_EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  caching_state();
  return stream_created(driver().cuStreamCreate(stream, flags), stream, flags, __builtin_return_address(0));
}

CUDALLOC_EXPORT CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  caching_state();
  return stream_created(driver().cuStreamCreateWithPriority(stream, flags, priority), stream, flags,
                        __builtin_return_address(0));
}

// A green context's streams (always non-blocking) belong to the green context, whose memory
// is its device's primary context's (hooks_context.cpp): that context's device fences record
// on them too (the driver takes the primary context's events there).
CUDALLOC_EXPORT CUresult cuGreenCtxStreamCreate(CUstream* stream, CUgreenCtx green, unsigned int flags,
                                                int priority) {
  ProcessState* ps = caching_state();
  const DriverApi& d = driver();
  if (d.cuGreenCtxStreamCreate == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUcontext in = nullptr;
  if (d.cuCtxFromGreenCtx == nullptr || d.cuCtxFromGreenCtx(&in, green) != CUDA_SUCCESS) in = nullptr;
  // A program may use a green context's streams without ever making it current.
  if (ps != nullptr && in != nullptr) adopt_green_context(*ps, in);
  return stream_created(d.cuGreenCtxStreamCreate(stream, green, flags, priority), stream,
                        flags | CU_STREAM_NON_BLOCKING, nullptr, in);
}

CUDALLOC_EXPORT CUresult cuStreamDestroy(CUstream stream) { return stream_destroy(driver().cuStreamDestroy, stream); }
CUDALLOC_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
  return stream_destroy(driver().cuStreamDestroy_v2, stream);
}

CUDALLOC_EXPORT CUresult cuStreamBeginCapture(CUstream stream) {
  return begin_capture(stream, false, [&] { return driver().cuStreamBeginCapture(stream); });
}
CUDALLOC_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream) {
  return begin_capture(stream, true, [&] { return driver().cuStreamBeginCapture_ptsz(stream); });
}
CUDALLOC_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  return begin_capture(stream, false, [&] { return driver().cuStreamBeginCapture_v2(stream, mode); });
}
CUDALLOC_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  return begin_capture(stream, true, [&] { return driver().cuStreamBeginCapture_v2_ptsz(stream, mode); });
}
CUDALLOC_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                                     const CUgraphEdgeData* edges, size_t count,
                                                     CUstreamCaptureMode mode) {
  return begin_capture(stream, false, [&] {
    return driver().cuStreamBeginCaptureToGraph(stream, graph, deps, edges, count, mode);
  });
}
CUDALLOC_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                                          const CUgraphEdgeData* edges, size_t count,
                                                          CUstreamCaptureMode mode) {
  return begin_capture(stream, true, [&] {
    return driver().cuStreamBeginCaptureToGraph_ptsz(stream, graph, deps, edges, count, mode);
  });
}

CUDALLOC_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  return end_capture(driver().cuStreamEndCapture, stream, graph, false);
}
CUDALLOC_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  return end_capture(driver().cuStreamEndCapture_ptsz, stream, graph, true);
}
