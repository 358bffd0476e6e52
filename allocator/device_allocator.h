// The caching allocator of one device: size classes, block pools, segments, fences, the
// out-of-memory ladder and the statistics. Backend-agnostic (see backend.h).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "allocator/backend.h"
#include "allocator/device_budget.h"
#include "allocator/events.h"
#include "allocator/memory_stats.h"
#include "allocator/oom_report.h"
#include "allocator/options.h"
#include "allocator/types.h"

namespace cudalloc {

// How a freed block may be reused.
enum class FreeOrder {
  // cudaFreeAsync(ptr, stream): reusable at once on `stream` if the block belongs to it;
  // elsewhere once the work queued on `stream` before the free has run.
  kStream,
  // cudaFree(ptr): reusable once all work queued on any stream before the free has run.
  kDevice,
  // The caller has synchronized the device: reusable at once, everywhere.
  kCompleted,
};

struct AllocationInfo {
  DevicePtr base = 0;           // the block's start, as handed to the program
  std::size_t size = 0;         // rounded size of the block
  std::size_t requested = 0;    // what the program asked for
  StreamHandle stream = 0;      // the stream it was allocated for (kNoStream: cudaMalloc)
  DevicePtr segment_base = 0;
  std::size_t segment_size = 0;
  // CU_POINTER_ATTRIBUTE_BUFFER_ID: this hand-out's own, the same at every query while it is
  // live, never another hand-out's; top bit set (the driver's own ids count from 1).
  std::uint64_t buffer_id = 0;
};

// Thread-safe. A cached allocate and free use only the calling thread's cache and a shard of
// the live-block map; everything else runs under the allocator's lock.
class DeviceAllocator {
 public:
  DeviceAllocator(SegmentBackend& backend, const AllocatorOptions& options, int device = 0);
  // Gives nothing back to the device: at process exit the driver may already be gone.
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // bytes == 0 is kInvalidValue (the driver's answer); the runtime never gets here for 0.
  Status allocate(std::size_t bytes, StreamHandle stream, DevicePtr* out, bool async = false);
  // kInvalidValue for an unknown pointer, an interior pointer or a double free; the cache
  // is left as it was.
  Status free(DevicePtr ptr, FreeOrder order, StreamHandle stream = kNoStream, bool async = false);
  // The block is also used on `stream`: its free waits for that stream too.
  Status record_stream(DevicePtr ptr, StreamHandle stream);

  // The live block containing `ptr` (interior pointers too).
  std::optional<AllocationInfo> find(DevicePtr ptr) const;
  // True if `ptr` lies in memory this allocator holds from the device (live, free or pending).
  bool owns(DevicePtr ptr) const;

  // Waits for pending frees and gives idle memory back to the device, longest idle first, until
  // at most `keep` bytes are reserved; 0 gives back everything idle (empty_cache). Returns
  // the bytes given back.
  std::size_t release_cached(std::size_t keep = 0);
  // Forgets every block and segment without touching the device (the context is gone).
  void forget_all();
  // Waits for every pending free to become reusable.
  void synchronize_pending();

  MemoryStats stats() const;
  void reset_peak_stats();
  std::string summary() const;
  std::optional<OomReport> last_oom() const;

  // Bytes held from the device that no live block uses (free, or waiting on a fence).
  std::size_t cached_bytes() const;
  std::size_t memory_limit() const;
  // What the device's budget holds against the limit (share_budget): every context's reserved
  // bytes, and segments given back but not yet freed by the device (during a capture).
  std::size_t budget_held() const;
  void set_memory_limit(std::size_t bytes);  // 0 = back to the configured limit
  // The options in force: expandable_segments is off where the backend has no virtual memory.
  const AllocatorOptions& options() const { return options_; }
  // Whether expandable_segments was asked for but the backend's device has no virtual memory
  // management (supports_virtual_memory, asked once, here): its segments are plain ones, as
  // PyTorch falls back to them. The shim warns; the summary says so.
  bool expandable_ignored() const { return expandable_ignored_; }
  int device() const { return device_; }

  // Not owned; called under the device lock. Null to stop.
  void set_observer(AllocatorObserver* observer);
  // Counts this allocator's memory against `budget`, shared with the other allocators of its
  // device, instead of a budget of its own. Before the first allocation.
  void share_budget(std::shared_ptr<DeviceBudget> budget);
  // The ladder's last step, taken with none of this allocator's locks held: `reclaim` gives
  // back memory held elsewhere on the device (the idle caches of its other contexts) and says
  // whether it gave any. Then the request is tried once more, and only the outcome of that try
  // is counted and reported (num_ooms, last_oom, the observer's kOom): a request served after
  // the reclaim was no out-of-memory failure. Before the first allocation.
  void set_reclaimer(std::function<bool()> reclaim);

  // In a fork child: the calling thread (the only one) drops its ties to every allocator's
  // thread caches without locking anything. The parent's allocators are abandoned there, and
  // their locks may have been held by threads that do not exist in the child; at exit this
  // thread would otherwise hand its caches back to them, under those locks.
  static void abandon_thread_caches_after_fork();

  struct Impl;

 private:
  bool expandable_ignored_;
  AllocatorOptions options_;
  int device_;
  std::shared_ptr<Impl> impl_;  // shared with the thread caches' owners (see thread_cache.h)
};

}  // namespace cudalloc
