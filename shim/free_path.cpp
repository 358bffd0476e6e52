#include "shim/free_path.h"

#include "driver/current_context.h"
#include "driver/driver_api.h"
#include "support/log.h"

namespace cudalloc::shim {

namespace {
CUresult bad_free(CUdeviceptr ptr, bool async) {
  log_warn("%s(0x%llx): not the start of a live allocation (double free or interior pointer); "
           "returning CUDA_ERROR_INVALID_VALUE, the cache is unchanged",
           async ? "cuMemFreeAsync" : "cuMemFree", static_cast<unsigned long long>(ptr));
  return CUDA_ERROR_INVALID_VALUE;
}
}  // namespace

CUresult free_owned(ProcessState& ps, ContextState& owner, CUdeviceptr ptr, bool async,
                    StreamInfo* stream, bool sync) {
  const auto p = static_cast<DevicePtr>(ptr);
  if (ps.captures.any()) {
    // Recording a fence now could break the capture; the free waits for its end.
    const auto info = owner.allocator.find(p);
    if (!info || info->base != p) return bad_free(ptr, async);
    ParkedFree f{&owner, ptr, async, stream, async && ps.captures.capturing(stream)};
    bool duplicate = false;
    if (ps.captures.park(f, &duplicate)) return CUDA_SUCCESS;
    if (duplicate) return bad_free(ptr, async);
    // The capture ended meanwhile: free now.
  }
  Status st;
  if (sync && !async) {
    // free_sync: the native cudaFree is a barrier; some programs rely on it.
    if (!owner.allocator.find(p)) return bad_free(ptr, async);
    {
      CurrentContext current(owner.ctx);
      driver().cuCtxSynchronize();
    }
    st = owner.allocator.free(p, FreeOrder::kCompleted);
  } else {
    st = free_ordered(ps, owner, p, async, stream);
  }
  if (st == Status::kInvalidValue) return bad_free(ptr, async);
  return to_cuda(st);
}

void run_parked(ProcessState& ps, const std::vector<ParkedFree>& parked) {
  for (const ParkedFree& f : parked) {
    if (!ps.contexts.is_live(f.owner)) continue;
    const auto p = static_cast<DevicePtr>(f.ptr);
    // A free inside the captured graph runs whenever the graph does: only a device fence,
    // recorded from now on, is safe for it.
    if (f.async && !f.in_graph) {
      f.owner->allocator.free(p, FreeOrder::kStream, key_of(f.stream), true);
    } else {
      f.owner->allocator.free(p, FreeOrder::kDevice, kNoStream, f.async);
    }
  }
  for (ContextState* s : ps.contexts.live()) s->backend.flush_deferred_frees();
}

}  // namespace cudalloc::shim
