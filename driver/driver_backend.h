// SegmentBackend over the real driver, for one context.
//
// Fences are events (pooled, timing disabled). A device fence must cover every stream of the
// context. One event recorded for the context (cuCtxRecordEvent) does, where the driver has
// it. Otherwise: an event on the legacy stream covers blocking streams and per-thread default
// streams, but not non-blocking ones, so the fence also records on each known non-blocking
// stream, and waits for the last work of non-blocking streams destroyed while it was still
// queued. Green contexts' streams (legacy and non-blocking) get events of their own either way.
// While a capture is on, fences are deferred: they record (as a device fence, later than
// needed, which is safe) once no capture is on any more.
//
// In a context with no non-blocking stream (library helper streams aside), the legacy event
// alone is the device fence, and it orders reuse (backend.h): work queued after it on the
// legacy stream runs after it, and so does work on any blocking or per-thread default stream,
// which waits for earlier legacy work. A non-blocking stream that appears later is made to
// wait for the legacy stream before its first work, so it too runs behind every such fence.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/backend.h"
#include "driver/capture.h"
#include "driver/cuda_api.h"
#include "driver/streams.h"

namespace cudalloc::shim {

class DriverBackend final : public SegmentBackend {
 public:
  // `watch`: the program's queued work (null: not watched), for the allocator's fence clock.
  DriverBackend(CUcontext ctx, CUdevice device, CaptureTracker& captures, SubmissionWatch* watch = nullptr);
  ~DriverBackend() override;

  Status allocate_segment(std::size_t bytes, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes) override;
  std::unique_ptr<Fence> record_fence(StreamHandle stream) override;
  std::unique_ptr<Fence> record_device_fence() override;
  std::size_t total_memory() const override { return total_; }
  SubmissionWatch* submission_watch() override { return watch_; }

  bool supports_virtual_memory() const override;
  std::size_t vm_granularity() const override;
  Status reserve_address(std::size_t bytes, DevicePtr* out) override;
  Status free_address(DevicePtr base, std::size_t bytes) override;
  Status map(DevicePtr va, std::size_t bytes) override;
  Status unmap(DevicePtr va, std::size_t bytes) override;
  bool can_remap() const override;
  Status map_pages(DevicePtr va, std::size_t bytes, std::size_t page) override;
  Status remap(const std::vector<DevicePtr>& from, DevicePtr to, std::size_t page) override;

  // Device `peer` may access this context's memory (peer access enabled from it): virtual
  // memory needs cuMemSetAccess for it, which a plain cuMemAlloc segment does not. Grants
  // read-write on every range mapped now, and every later map and remap includes it.
  void grant_peer(CUdevice peer);

  // A non-blocking stream of this context (from the stream hooks); `helper`: a library's
  // helper stream (helper_streams.h).
  void add_stream(StreamInfo* s, bool helper = false);
  // A helper stream met in a memory call: from now on it counts as the program's own.
  void unmark_helper(StreamInfo* s);
  // Blocks until the device work queued so far on the context's streams is done: then no
  // block handed out again, in stream order or after an ordering fence, is still used by its
  // previous owner's work. (Another process, given an IPC handle, is ordered behind none of
  // it.) False, waiting for nothing, while a capture is on and that work is not done.
  bool settle_reuse();
  // Called before the stream is destroyed: remembers an event after its last work.
  void remove_stream(StreamInfo* s);
  // single_stream's end (single_stream.h): an event on the legacy stream behind the work
  // queued so far, which non-blocking streams then wait for (follow_ordered_era).
  void end_ordered_era();
  void follow_ordered_era(StreamInfo* s);
  // A green context of this (primary) context's device: its memory is this context's, and its
  // kernels may use any block, so device fences record on its legacy stream too, and reuse is
  // never ordered by the legacy stream alone. remove_green: it is about to be destroyed, its work
  // done; its streams are forgotten too.
  void add_green(CUcontext green);
  void remove_green(CUcontext green);
  // Frees the segments given back while a capture was on, unless one still is. Also done at
  // this context's next fence or new segment; after the last capture's end, at once
  // (run_parked), so that their room under the limit does not wait for this context.
  void flush_deferred_frees();
  // The context is gone: no driver call on its objects any more.
  void mark_dead();
  bool dead() const;
  CUcontext context() const { return ctx_; }
  CUdevice device() const { return device_; }

  // --- for IPC of expandable-segment blocks (ipc_export.h)
  struct MappedChunk {
    DevicePtr va;  // where this backend mapped the chunk, from its start
    std::size_t bytes;
  };
  // The physical chunks mapped over [va, va + bytes), in address order (the first may start
  // before va); false unless every byte lies in chunks this backend mapped (plain segments).
  bool describe_range(DevicePtr va, std::size_t bytes, std::vector<MappedChunk>* out) const;
  // A POSIX file descriptor for the chunk mapped at `va`, `bytes` long, which the caller
  // closes; the driver's error if the chunk cannot be exported, or INVALID_VALUE if it is no
  // longer mapped there.
  CUresult export_chunk(DevicePtr va, std::size_t bytes, int* fd) const;
  // Whether this device's chunks are made with a POSIX file descriptor handle type.
  bool chunks_exportable() const;

  // --- for the fences
  struct Tail;
  std::unique_ptr<Fence> device_fence_now();
  // The driver's error behind this thread's last Status::kBackendError (CUDA_SUCCESS if none),
  // taken once.
  static CUresult take_refusal();
  // A fence on `handle`, a stream of context `ctx` (not this backend's).
  std::unique_ptr<Fence> foreign_fence(CUcontext ctx, CUstream handle);
  CUevent take_event();
  void give_event(CUevent e);
  const CaptureTracker& captures() const { return captures_; }

 private:
  CUcontext ctx_;
  CUdevice device_;
  CaptureTracker& captures_;
  SubmissionWatch* const watch_;
  std::size_t total_ = 0;
  mutable std::mutex mutex_;  // everything below
  bool dead_ = false;
  std::vector<CUevent> free_events_;
  std::vector<StreamInfo*> non_blocking_;
  std::vector<CUcontext> greens_;
  CUevent ordered_era_end_ = nullptr;  // kept for the context's life; null: none, or waited for
  // Recorded on the legacy stream by every fence that orders reuse (see above), so that a
  // non-blocking stream met later can wait behind them all, even while a capture is on; null
  // until the first one. Kept for the context's life. Written under the lock; atomic so that a
  // fence can tell without the lock whether it must bring an event for it.
  std::atomic<CUevent> order_mark_{nullptr};
  std::vector<std::shared_ptr<Tail>> tails_;
  // Whether device fences still try one event for the whole context (record_context_event).
  std::atomic<bool> context_events_{true};
  std::map<DevicePtr, std::pair<std::size_t, CUmemGenericAllocationHandle>> mapped_;
  // Held through each map, unmap, remap and grant, so that a grant sees every range mapped
  // without it and every map after it sees the grant. Those run under the allocator's device
  // lock already, so it costs them no waiting; cached allocations never take it.
  std::mutex vm_mutex_;
  struct MapCall;  // driver_backend.cpp
  std::vector<CUdevice> access_devices_;  // this device, then granted peers; under vm_mutex_
  // Segments given back while a capture was on (cuMemFree would break a global capture), with
  // their sizes: they count against the limit until freed (backend.h, kDeferred).
  std::vector<std::pair<DevicePtr, std::size_t>> deferred_frees_;
  // `s` (of context `in`, this one's by default) runs nothing queued from now on before `e`
  // completes (the host waits if it cannot).
  void wait_behind(CUstream s, CUevent e, CUcontext in = nullptr);
  // An event recorded for the whole context (see device_fence_now), or null. Only where no
  // capture can begin (captures_.unless_capturing): it would invalidate any capture of the context.
  CUevent record_context_event();
  CUresult map_handle(DevicePtr va, std::size_t bytes, CUmemGenericAllocationHandle h);
  // Read-write for each of access_devices_. Under vm_mutex_.
  std::vector<CUmemAccessDesc> access_locked() const;
  // cuMemCreate of a chunk: exportable where the device allows it (see chunks_exportable).
  CUresult create_chunk(CUmemGenericAllocationHandle* h, std::size_t bytes);
};

}  // namespace cudalloc::shim
