// The interface between the allocator core and the device it manages memory on.
//
// The core never talks to CUDA. Two implementations exist: the simulated backend
// (allocator/sim_backend.h: host memory, streams whose work runs later) used by every unit
// test, replay and fuzzer, and the driver backend (driver/driver_backend.h) for real devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "allocator/types.h"

namespace cudalloc {

class SubmissionWatch;

// A point in a stream's (or every stream's) queue. Completes once all work queued before it ran.
class Fence {
 public:
  virtual ~Fence() = default;
  // Non-blocking. A backend that can no longer tell (driver gone) reports true.
  virtual bool done() = 0;
  // Blocks until done(). False if it cannot wait now (e.g. the stream is being captured);
  // the fence then stays pending.
  virtual bool wait() = 0;
  // Whether every piece of work queued after this fence, on any stream that can reach the
  // memory, runs after it: then a block it covers may go back to the program before the fence
  // completes (its next owner's work is ordered behind the last owner's). A device fence can
  // say so in a context whose streams all order with the legacy stream. Giving memory back
  // to the device still needs done() or wait().
  virtual bool orders_reuse() const { return false; }
};

// Whether `f` no longer keeps the blocks it covers from the program.
inline bool reusable_after(Fence& f) { return f.orders_reuse() || f.done(); }

// Handle of physical memory created for virtual-memory (expandable) segments.
using PhysicalHandle = std::uint64_t;

class SegmentBackend {
 public:
  virtual ~SegmentBackend() = default;

  // --- plain segments (cuMemAlloc / cuMemFree)
  virtual Status allocate_segment(std::size_t bytes, DevicePtr* out) = 0;
  // Returns the memory to the device. Callers fence first; the backend does not wait.
  // kDeferred: the device cannot take it back now (the driver forbids cuMemFree during a stream
  // capture); the backend frees it later and then calls deferred_done, so that the memory counts
  // against the limit for as long as the device holds it.
  virtual Status free_segment(DevicePtr ptr, std::size_t bytes) = 0;
  // Told of each free_segment that returned kDeferred, once, with its address and bytes:
  // `freed` when the device took the memory back (or it went with its context); not `freed`
  // when the device refused it then, so that the memory, still the device's, is the caller's
  // again (else nobody would hold it, nor ever free it). From any thread, possibly under the
  // allocator's lock (a backend may free parked segments at its next segment or fence): it
  // must take none. Set by the allocator over this backend, before its first allocation.
  using DeferredDone = std::function<void(DevicePtr ptr, std::size_t bytes, bool freed)>;
  void set_deferred_done(DeferredDone f) { deferred_done_ = std::move(f); }

  // --- ordering
  // A fence after all work queued so far on `stream`.
  virtual std::unique_ptr<Fence> record_fence(StreamHandle stream) = 0;
  // A fence after all work queued so far on every stream of the device.
  virtual std::unique_ptr<Fence> record_device_fence() = 0;

  // Notes of the device work the program queues (submission_watch.h), or null when the
  // backend cannot see it all: then every cudaFree'd block waits for a fence of its own.
  virtual SubmissionWatch* submission_watch() { return nullptr; }

  // --- device facts
  virtual std::size_t total_memory() const = 0;

  // --- virtual memory (expandable segments)
  virtual bool supports_virtual_memory() const { return false; }
  virtual std::size_t vm_granularity() const { return 2 * kMiB; }
  virtual Status reserve_address(std::size_t /*bytes*/, DevicePtr* /*out*/) { return Status::kBackendError; }
  virtual Status free_address(DevicePtr /*base*/, std::size_t /*bytes*/) { return Status::kBackendError; }
  // create + map + set access of [va, va+bytes); rolls back what it did on failure.
  virtual Status map(DevicePtr /*va*/, std::size_t /*bytes*/) { return Status::kBackendError; }
  // unmap + release of [va, va+bytes), which was mapped by map() or map_pages() calls covering
  // it exactly.
  virtual Status unmap(DevicePtr /*va*/, std::size_t /*bytes*/) { return Status::kBackendError; }

  // --- page-granular virtual memory (page stitching)
  // Whether physical pages can move between addresses now: map_pages and remap work, and no
  // stream capture is under way (a captured graph keeps the addresses it saw).
  virtual bool can_remap() const { return false; }
  // As map(), with one physical allocation per `page` bytes (a multiple of the granularity that
  // divides `bytes`), so that remap() can move each page on its own.
  virtual Status map_pages(DevicePtr va, std::size_t bytes, std::size_t /*page*/) { return map(va, bytes); }
  // Moves the physical pages mapped at each of `from` (`page` bytes each, made by map_pages) to
  // the contiguous range starting at `to`, in that order: unmapped there, mapped here with
  // access set. No page is released or created. All or nothing: on failure every page is
  // back where it was. The caller has made sure no device work can still touch `from`.
  virtual Status remap(const std::vector<DevicePtr>& /*from*/, DevicePtr /*to*/, std::size_t /*page*/) {
    return Status::kBackendError;
  }

 protected:
  void deferred_done(DevicePtr ptr, std::size_t bytes, bool freed) const {
    if (deferred_done_) deferred_done_(ptr, bytes, freed);
  }
  // Frees segments deferred earlier and tells deferred_done how each went (one deferred again,
  // a capture having begun meanwhile, is told later).
  void free_deferred(const std::vector<std::pair<DevicePtr, std::size_t>>& frees) {
    for (const auto& [ptr, bytes] : frees) {
      const Status st = free_segment(ptr, bytes);
      if (st != Status::kDeferred) deferred_done(ptr, bytes, st == Status::kOk);
    }
  }

 private:
  DeferredDone deferred_done_;
};

}  // namespace cudalloc
