// The streams the process uses, as keys for the allocator (StreamHandle) and as facts the
// backend needs: which streams are non-blocking (a device fence must record on each of
// them), and which stream a per-thread default stream key belongs to.
//
// A key is the address of a StreamInfo that is never freed, so a destroyed stream's key is
// never reused by a new stream that happens to get the same CUstream value.
#pragma once

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "allocator/types.h"
#include "driver/cuda_api.h"

namespace cudalloc::shim {

struct StreamInfo {
  enum class Kind { kLegacy, kPerThread, kCreated };
  Kind kind = Kind::kCreated;
  CUstream handle = nullptr;    // kCreated: the stream; else the driver's special handle
  CUcontext ctx = nullptr;      // kCreated: the stream's context
  bool non_blocking = false;
  std::atomic<bool> alive{true};
  // A non-blocking stream that a library forks onto from its caller's stream and joins back
  // (helper_streams.h): ordered with the caller's stream. Cleared if it meets a memory call.
  std::atomic<bool> helper{false};
  // Device fences still to record an event here without asking first whether the stream is
  // idle: one found busy is not asked again for a while (driver_backend.cpp). On a line of its
  // own: every thread's fences write it, while the stream's own thread reads the fields above
  // on each call.
  alignas(64) std::atomic<std::uint8_t> busy_fences{0};
};

inline StreamHandle key_of(const StreamInfo* s) { return reinterpret_cast<StreamHandle>(s); }
inline StreamInfo* info_of(StreamHandle key) { return reinterpret_cast<StreamInfo*>(key); }

// The handle to pass to the driver for `s` from the calling thread, or nullopt-like false
// when that cannot be done here (another thread's per-thread default stream).
bool driver_handle(const StreamInfo* s, CUstream* out);

class StreamRegistry;

// The calling thread's last answer of StreamRegistry::resolve: threads mostly use one stream at
// a time. Constant-initialized and trivially destructible, so reading it costs no TLS wrapper.
struct LastStream {
  const StreamRegistry* registry = nullptr;
  CUstream handle = nullptr;
  StreamInfo* info = nullptr;
};
inline thread_local LastStream t_last_stream __attribute__((tls_model("initial-exec")));

namespace detail {
// The calling thread's per-thread default stream, made by its first use (per_thread()).
// Trivially destructible, so no thread-exit destructor runs; the info is never freed.
// initial-exec: the library is preloaded (static TLS), and this avoids __tls_get_addr.
inline thread_local StreamInfo* t_per_thread __attribute__((tls_model("initial-exec"))) = nullptr;
}  // namespace detail

class StreamRegistry {
 public:
  StreamInfo* legacy() { return &legacy_; }
  // The calling thread's per-thread default stream.
  StreamInfo* per_thread();
  // The stream an API call names. `ptsz`: the call was a _ptsz variant, where 0 means the
  // per-thread default stream. Unknown streams are learnt (cuStreamGetFlags/GetCtx);
  // `learnt` is set when that happened, so the caller can tell the backend.
  // Inline up to the last answer, so that the hot path pays no call and no register saves
  // for what the slow path needs.
  StreamInfo* resolve(CUstream s, bool ptsz, bool* learnt = nullptr) {
    if (learnt) *learnt = false;
    if (StreamInfo* si = known(s, ptsz)) return si;
    // The thread's first use of its per-thread default stream makes it.
    if (s == CU_STREAM_PER_THREAD || (ptsz && s == nullptr)) return per_thread();
    return resolve_slow(s, learnt);
  }
  // resolve() where it needs no call and learns nothing: the calling thread's last created
  // stream when `s` is that one and still alive, the legacy stream, or the thread's per-thread
  // default stream once it has been made. Else null. (StreamInfo objects are never freed; a
  // destroyed or replaced stream's info is marked dead, which sends the next call to the
  // registry.)
  StreamInfo* known(CUstream s, bool ptsz) {
    const LastStream& last = t_last_stream;
    if (last.registry == this && last.handle == s && last.info->alive.load(std::memory_order_acquire)) {
      return last.info;
    }
    if (s == CU_STREAM_PER_THREAD || (ptsz && s == nullptr)) return detail::t_per_thread;
    if (s == nullptr || s == CU_STREAM_LEGACY) return legacy();
    return nullptr;
  }
  // A stream the process just created in `ctx`.
  StreamInfo* created(CUstream s, CUcontext ctx, unsigned flags);
  // A stream about to be destroyed; null if unknown. Its info stays valid (alive = false).
  StreamInfo* destroyed(CUstream s);

 private:
  // A created stream that is not the thread's last one: the registry, then the driver.
  StreamInfo* resolve_slow(CUstream s, bool* learnt);

  StreamInfo legacy_{StreamInfo::Kind::kLegacy, CU_STREAM_LEGACY, nullptr, false, {true}};
  std::mutex mutex_;
  std::unordered_map<CUstream, StreamInfo*> streams_;
};

}  // namespace cudalloc::shim
