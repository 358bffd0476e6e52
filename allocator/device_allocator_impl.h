// The state behind a DeviceAllocator and the ladder that composes its parts. Each part keeps
// its own state behind a small interface: the limit and the device's budget (MemoryLimit),
// the statistics (Statistics), the observer and its running totals (EventReporter), what a
// failing request leaves behind (OutOfMemory), segments the device frees later
// (ParkedSegments), free blocks and coalescing (FreeBlocks), virtual-memory growth
// (ExpandableSegments), fences (FenceQueue, FenceClock), the thread caches (ThreadCache).
// Impl's methods are the ladder and the plumbing between the parts, in four files: the
// thread-cache hot paths (thread_cache_paths.cpp), the locked allocate/free ladder
// (ladder.cpp), getting and giving back plain segments (device_segments.cpp) and the reclaim
// steps of the out-of-memory ladder (reclaim.cpp); the public API is in device_allocator.cpp.
// Only what the hot path calls is defined inline; everything but the hot path runs under
// `mutex`.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/device_mutex.h"
#include "allocator/event_reporter.h"
#include "allocator/expandable_segments.h"
#include "allocator/fence_clock.h"
#include "allocator/free_blocks.h"
#include "allocator/live_map.h"
#include "allocator/memory_limit.h"
#include "allocator/out_of_memory.h"
#include "allocator/parked_segments.h"
#include "allocator/region_filter.h"
#include "allocator/segment_table.h"
#include "allocator/size_classes.h"
#include "allocator/spin_lock.h"
#include "allocator/statistics.h"
#include "allocator/stream_fence.h"
#include "allocator/thread_cache.h"

namespace cudalloc {

struct DeviceAllocator::Impl final : std::enable_shared_from_this<DeviceAllocator::Impl>, SegmentLedger {
  Impl(SegmentBackend& b, const AllocatorOptions& o, int dev);

  SegmentBackend& backend;
  const AllocatorOptions& options;
  SizeClasses sizes;
  int device;
  const std::uint64_t id;
  // Its observer pointer is read by every cached allocate and free, as are the fields above;
  // its running totals start a line of their own.
  EventReporter events{device};
  // The lock and what it guards start on a line of their own, so that a thread on the locked
  // path does not make every other thread's next read of the observer a miss (a visible share
  // of every cached allocate and free under many threads).
  alignas(64) DeviceMutex mutex;

  Statistics stats;
  std::uint64_t tick = 0;
  FreeBlocks blocks{sizes, stats.totals, tick};
  SegmentTable segments;
  ExpandableSegments expandable{backend, segments, blocks, stats.totals, *this,
                                options.page_stitching ? PageStitching::kOn : PageStitching::kOff,
                                options.stitch_page_bytes};
  FenceQueue fences;
  alignas(64) FenceClock batch_fences;  // the device fences of the thread caches' batches (shared)
  LiveMap live;
  RegionFilter regions;  // where this allocator's memory may lie (note_device_alloc)
  std::vector<std::shared_ptr<ThreadCache>> caches;
  MemoryLimit memory_limit{backend, options};
  // Segments the backend frees later (kDeferred), still claimed in the budget until it has.
  ParkedSegments parked;
  OutOfMemory oom;

  std::size_t reserved() const { return segments.bytes(); }

  // --- thread caches (thread_cache_paths.cpp)
  ThreadCache& local_cache();
  void retire(const std::shared_ptr<ThreadCache>& cache);
  // The live block that starts at `ptr`, taken out of the shared map or another thread's
  // table; null if none.
  Block* take_live_elsewhere(DevicePtr ptr);
  // The same without taking it. Under `mutex`.
  Block* find_live_locked(DevicePtr ptr);
  // Whether `ptr` starts a live block of the shared map or of the calling thread's cache; no
  // device lock.
  bool live_here(DevicePtr ptr);
  // The first block `look` finds in a thread's live table, each table under its cache's lock;
  // null if none. Under `mutex` (it guards `caches`).
  template <typename F>
  Block* in_thread_tables(F&& look) {
    for (auto& cache : caches) {
      std::lock_guard cache_lock(cache->lock);
      if (Block* b = look(cache->live)) return b;
    }
    return nullptr;
  }
  // How much of a thread cache a drain takes: what is pending (its deferred frees, its spill,
  // its batches but the two newest), or, when memory is short, its bins and every batch too.
  enum class Drain : bool { kPending, kWithBins };
  void drain(ThreadCache& cache, Drain what);
  // What refill() did: moved blocks into the bin; found no batch, or the oldest not past its
  // fence; or could not tell without waiting for another thread (FenceClock::try_passed).
  enum class Refill { kDone, kNone, kBusy };
  // What refill() does when another thread is recording the fence it needs: wait for it, or
  // answer kBusy so that the caller bridges.
  enum class BusyFence : bool { kWait, kBridge };
  Refill refill(ThreadCache& cache, StreamHandle stream, std::size_t rounded, BusyFence busy);
  // The slow ends of DeviceAllocator::allocate and ::free (thread_cache_paths.cpp), out of
  // line so that the hot paths save no registers: a miss of the hot path; a hit whose block
  // enters the live table's hashed part; a hit, or a cached free, reported to the observer; the
  // locked path; a free the hot path does not take; a reusable block its bin has no room for; a full batch.
  Status allocate_missed(std::size_t bytes, StreamHandle stream, DevicePtr* out, CallKind call);
  Status hit_into_table(ThreadCache& cache, Block* b, std::size_t bytes, StreamHandle stream, DevicePtr* out,
                        CallKind call);
  Status observed_hit(const Block* b, std::size_t bytes, StreamHandle stream, CallKind call);
  // `call` last: the hot free passes it on in the register it came in.
  void observed_free(const Block* b, StreamHandle stream, Locality locality, CallKind call);
  // A small miss whose thread keeps its cache (no drain_own) rather than wait for another
  // thread's fence: see allocate_missed.
  enum class Bridge : bool { kNo, kYes };
  Status allocate_locked(std::size_t bytes, StreamHandle stream, DevicePtr* out, CallKind call,
                         Bridge bridge = Bridge::kNo);
  Status free_block(DevicePtr ptr, FreeOrder order, StreamHandle stream, CallKind call, ThreadCache* own);
  bool spill(ThreadCache& cache, Block* b);
  Status release_spill(ThreadCache& cache);
  void return_spill(ThreadCache& cache);
  void release_own_spill();
  Status free_large_deferred(Block* b, ThreadCache& own, StreamHandle stream, CallKind call, Locality locality);
  // Closes the thread's deferred frees as a batch once one is due, or now if there are any
  // (kNot: not yet; batch_due says which).
  enum class CloseWhen { kNot, kDue, kNow };
  Status close_batch(ThreadCache& cache, CloseWhen when = CloseWhen::kDue);
  CloseWhen batch_due(ThreadCache& cache);
  // This thread's cache for this allocator, or null; creates none (safe under `mutex`).
  ThreadCache* find_local_cache();
  // A small miss, before new memory is cut: this thread's bins, spill and batches past their
  // fences go back to the pools; its deferred frees and the batches still waiting stay.
  void drain_own();
  // Under the cache's lock: its batches past their fences go back to the pools; how many blocks.
  std::size_t release_passed_batches(ThreadCache& cache);
  // A large miss about to cut new memory: every thread's batches past their fences, the caches
  // busy with their owners skipped; whether any block went back.
  bool release_all_passed_batches();
  // Only its large bins (a large miss: small blocks cannot serve it).
  void drain_own_large();
  void drain_all(Drain what);

  // --- the locked ladder: blocks changing hands (ladder.cpp)
  void release_block(Block* b);
  std::size_t collect_ready();
  std::size_t wait_pending();
  Block* reach_epoch(Block* fit, StreamHandle stream, std::size_t rounded);
  void take(Block* b, std::size_t requested, std::size_t rounded);
  // Which try of a request the locked ladder is: the only one; the first of two, whose failure
  // for want of memory returns kOutOfMemory without counting or reporting it (the caller
  // reclaims and tries again); or that second one, which counts the request's lock and retry
  // no more (the first did: the statistics count requests, not runs of the ladder).
  enum class Try { kOnly, kFirst, kAgain };
  Status allocate(std::size_t bytes, StreamHandle stream, DevicePtr* out, CallKind call, Try attempt = Try::kOnly,
                  Bridge bridge = Bridge::kNo);
  // Counts and reports a request that failed for want of memory.
  Status out_of_memory(std::size_t bytes, StreamHandle stream, CallKind call);
  void free(Block* b, FreeOrder order, StreamHandle stream, CallKind call);

  // --- device memory (device_segments.cpp)
  Block* new_segment(StreamHandle stream, std::size_t rounded, PoolKind kind);
  // Enters memory held from the device as a wholly free plain segment, and counts it.
  Segment* add_segment(DevicePtr base, std::size_t size, PoolKind kind, StreamHandle stream);
  // Gives an idle plain segment back to the device; false, keeping it, if the device refused.
  bool free_segment(Segment* s);
  // The backend freed (or the device refused) a segment it had deferred (backend.h); takes
  // only the parking lock.
  void deferred_done(DevicePtr ptr, std::size_t bytes, bool freed);
  // Segments whose deferred free the device refused become idle segments of their pools again.
  void take_back_refused();
  // Tells the observer that every live block and every segment went with the context
  // (forget_all), the totals falling to zero; no device call.
  void report_forgotten();
  Block* obtain(StreamHandle stream, std::size_t rounded, PoolKind kind);
  std::size_t device_limit() const override { return memory_limit.in_force(); }
  bool claim(std::size_t bytes) override { return memory_limit.claim(bytes); }
  void unclaim(std::size_t bytes) override { memory_limit.unclaim(bytes); }
  void note_device_alloc(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) override;
  void note_device_free(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) override;
  void note_device_error(Status error) override { oom.note_device_error(error); }
  void note_pages_out(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) override;
  void note_pages_in(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) override;

  // --- reclaim steps of the out-of-memory ladder (reclaim.cpp)
  void collect_garbage();
  void give_back_idle(std::size_t target);
  bool release_oversize(std::size_t rounded);
  Block* adopt_idle_segment(StreamHandle stream, std::size_t rounded, PoolKind kind);
  // Waits for pending frees, then gives back idle memory until at most `keep` is reserved.
  std::size_t release_idle(std::size_t keep = 0);
  OomReport make_oom_report(std::size_t requested, std::size_t rounded, StreamHandle stream);
};

}  // namespace cudalloc
