#include "driver/streams.h"

#include "driver/driver_api.h"

namespace cudalloc::shim {

bool driver_handle(const StreamInfo* s, CUstream* out) {
  switch (s->kind) {
    case StreamInfo::Kind::kLegacy:
      *out = CU_STREAM_LEGACY;
      return true;
    case StreamInfo::Kind::kPerThread:
      *out = CU_STREAM_PER_THREAD;
      return s == detail::t_per_thread;
    case StreamInfo::Kind::kCreated:
      *out = s->handle;
      return s->alive.load(std::memory_order_acquire);
  }
  return false;
}

StreamInfo* StreamRegistry::per_thread() {
  StreamInfo*& mine = detail::t_per_thread;
  if (mine == nullptr) {
    mine = new StreamInfo;
    mine->kind = StreamInfo::Kind::kPerThread;
    mine->handle = CU_STREAM_PER_THREAD;
  }
  return mine;
}

StreamInfo* StreamRegistry::resolve_slow(CUstream s, bool* learnt) {
  {
    std::lock_guard lock(mutex_);
    auto it = streams_.find(s);
    if (it != streams_.end()) {
      t_last_stream = LastStream{this, s, it->second};
      return it->second;
    }
  }
  // A stream created before we could see it (or by a path we do not hook): ask the driver.
  const DriverApi& d = driver();
  unsigned flags = 0;
  CUcontext ctx = nullptr;
  if (d.cuStreamGetFlags) d.cuStreamGetFlags(s, &flags);
  if (d.cuStreamGetCtx) d.cuStreamGetCtx(s, &ctx);
  if (ctx == nullptr && d.cuCtxGetCurrent) d.cuCtxGetCurrent(&ctx);
  std::lock_guard lock(mutex_);
  auto [it, inserted] = streams_.try_emplace(s, nullptr);
  if (inserted) {
    auto* info = new StreamInfo;
    info->handle = s;
    info->ctx = ctx;
    info->non_blocking = (flags & CU_STREAM_NON_BLOCKING) != 0;
    it->second = info;
    if (learnt) *learnt = true;
  }
  return it->second;
}

StreamInfo* StreamRegistry::created(CUstream s, CUcontext ctx, unsigned flags) {
  auto* info = new StreamInfo;
  info->handle = s;
  info->ctx = ctx;
  info->non_blocking = (flags & CU_STREAM_NON_BLOCKING) != 0;
  std::lock_guard lock(mutex_);
  auto [it, inserted] = streams_.try_emplace(s, info);
  if (!inserted) {
    // The handle of a stream we never saw destroyed: the old key is dead from now on.
    it->second->alive.store(false, std::memory_order_release);
    it->second = info;
  }
  return info;
}

StreamInfo* StreamRegistry::destroyed(CUstream s) {
  std::lock_guard lock(mutex_);
  auto it = streams_.find(s);
  if (it == streams_.end()) return nullptr;
  StreamInfo* info = it->second;
  streams_.erase(it);
  info->alive.store(false, std::memory_order_release);
  return info;
}

}  // namespace cudalloc::shim
