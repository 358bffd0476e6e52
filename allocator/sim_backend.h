// A simulated device: host memory behind device pointers, streams whose queued work runs only
// when the test (or replay) lets the device catch up, fences, virtual memory, a settable
// capacity and fault injection. Every allocator policy is tested, replayed and fuzzed on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "allocator/backend.h"
#include "allocator/submission_watch.h"

namespace cudalloc {

struct SimOptions {
  std::size_t total_memory = 80 * kGiB;
  // Back device pointers with (lazily committed) host memory so tests can read and write them.
  // Without it, addresses are made up and must not be touched: replays of huge traces use that.
  bool host_memory = true;
  std::size_t vm_granularity = 2 * kMiB;
  // Virtual memory management: without it reserve_address and map fail (kBackendError, as the
  // driver refuses cuMemAddressReserve and cuMemCreate with CUDA_ERROR_NOT_SUPPORTED).
  bool virtual_memory = true;
  // Every stream orders with the legacy stream, as in a program with no non-blocking stream:
  // device fences order reuse (backend.h), as the driver backend's do in such a context.
  bool blocking_streams = false;
  // Watch the work queued (enqueue, enqueue_access) as the shim watches the program's launches:
  // a cudaFree with no work queued since a passed fence reuses its block at once
  // (submission_watch.h). Off, every cudaFree'd block waits for a fence of its own.
  bool watch_submissions = false;
};

enum class SimOp { kAllocate, kFree, kReserve, kMap, kUnmap, kDeviceFence, kRemap };

class SimBackend final : public SegmentBackend {
 public:
  explicit SimBackend(SimOptions options = {});
  ~SimBackend() override;

  // --- SegmentBackend
  Status allocate_segment(std::size_t bytes, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes) override;
  std::unique_ptr<Fence> record_fence(StreamHandle stream) override;
  std::unique_ptr<Fence> record_device_fence() override;
  std::size_t total_memory() const override;
  SubmissionWatch* submission_watch() override { return options_.watch_submissions ? &watch_ : nullptr; }
  bool supports_virtual_memory() const override { return options_.virtual_memory; }
  std::size_t vm_granularity() const override { return options_.vm_granularity; }
  Status reserve_address(std::size_t bytes, DevicePtr* out) override;
  Status free_address(DevicePtr base, std::size_t bytes) override;
  Status map(DevicePtr va, std::size_t bytes) override;
  Status unmap(DevicePtr va, std::size_t bytes) override;
  bool can_remap() const override;
  Status map_pages(DevicePtr va, std::size_t bytes, std::size_t page) override;
  Status remap(const std::vector<DevicePtr>& from, DevicePtr to, std::size_t page) override;

  // --- the simulated device
  // Queues work on a stream (created on first use; 0 is the default stream). It runs when
  // run()/run_all() or a fence wait lets the stream advance.
  void enqueue(StreamHandle stream, std::function<void()> work = {});
  // Runs up to `max_items` queued items of `stream`; returns how many ran.
  std::size_t run(StreamHandle stream, std::size_t max_items = SIZE_MAX);
  void run_all();
  std::size_t queued(StreamHandle stream) const;
  // Queues work on `stream` that reads and writes [ptr, ptr+bytes) when it runs: it counts a
  // bad access if the range is not mapped then, and an unmap or remap of any of it before it
  // ran counts as unsafe (the allocator let the device lose memory that queued work still uses).
  void enqueue_access(StreamHandle stream, DevicePtr ptr, std::size_t bytes);
  // While on, can_remap() says no, as the driver backend does during a stream capture.
  void set_capturing(bool capturing);

  // --- capacity and faults
  void set_total_memory(std::size_t bytes);
  // The call of `op` after `calls_from_now` more successful ones fails (kOutOfMemory for
  // allocate/map, kBackendError otherwise). One-shot.
  void fail_after(SimOp op, std::size_t calls_from_now);
  // Fences never complete on their own (a hung device); wait() still runs the streams.
  void set_fences_stall(bool stall);
  // Runs `f` once, at the next call of `op` (kFree or kUnmap), before that call acts, so the
  // device still holds the memory: what another context does while that driver call runs.
  // With kDeviceFence, at the next device fence, before it is recorded: a recording that takes
  // long on one thread while others go on (`f` may block).
  void during_next(SimOp op, std::function<void()> f);
  // While on, free_segment frees nothing and answers kDeferred, as the driver backend does
  // during a stream capture; finish_deferred_frees() then frees those segments and tells the
  // allocator (SegmentBackend::set_deferred_done).
  void set_defer_frees(bool defer);
  void finish_deferred_frees();

  // --- what happened
  std::size_t used_bytes() const;
  std::size_t segment_calls() const;
  std::size_t free_calls() const;
  std::size_t map_calls() const;
  std::size_t unmap_calls() const;
  std::size_t remap_calls() const;
  std::size_t remapped_pages() const;
  // Unmaps and remaps that took memory from work still queued (enqueue_access), and queued
  // accesses that found their range unmapped when they ran. A correct allocator keeps all 0.
  std::size_t unsafe_unmaps() const;
  std::size_t bad_accesses() const;
  // The physical allocation mapped at `va` (0: none): a test tells pages apart by it.
  std::uint64_t physical_at(DevicePtr va) const;
  // Address space reserved (reserve_address) and not yet freed.
  std::size_t reserved_address_bytes() const;
  std::size_t device_fences() const;
  std::size_t stream_fences() const;
  // True if [ptr, ptr+bytes) is inside a live segment or mapped virtual memory.
  bool is_accessible(DevicePtr ptr, std::size_t bytes) const;

 private:
  struct Stream {
    std::deque<std::function<void()>> work;
    std::uint64_t enqueued = 0;
    std::uint64_t completed = 0;
  };
  class SimFence;

  bool should_fail(SimOp op);
  void run_during(SimOp op);
  Stream& stream(StreamHandle handle);  // under mutex_
  std::size_t run_locked(StreamHandle handle, std::uint64_t until);
  DevicePtr take_address(std::size_t bytes, std::size_t alignment);
  void give_address(DevicePtr base, std::size_t bytes);

  SimOptions options_;
  SubmissionWatch watch_;
  mutable std::recursive_mutex mutex_;
  std::map<StreamHandle, Stream> streams_;
  std::map<DevicePtr, std::size_t> segments_;
  std::map<DevicePtr, std::size_t> reservations_;
  struct Mapping {
    std::size_t bytes = 0;
    std::uint64_t physical = 0;  // the id of the physical allocation behind it
  };
  std::map<DevicePtr, Mapping> mappings_;
  std::uint64_t next_physical_ = 1;
  struct Access {
    StreamHandle stream;
    std::uint64_t seq;  // the stream's work item that makes it
    DevicePtr ptr;
    std::size_t bytes;
  };
  std::vector<Access> accesses_;  // queued, not yet run
  bool capturing_ = false;
  // Whether queued work still touches [va, va+bytes); under mutex_.
  bool still_accessed(DevicePtr va, std::size_t bytes) const;
  // Checks that [va, va+bytes) lies in a reservation and overlaps no mapping; under mutex_.
  bool free_address_range(DevicePtr va, std::size_t bytes) const;
  std::size_t used_ = 0;
  DevicePtr next_fake_address_ = DevicePtr{1} << 44;
  std::map<SimOp, std::size_t> fail_countdown_;
  std::map<SimOp, std::function<void()>> during_;
  bool defer_frees_ = false;
  std::vector<std::pair<DevicePtr, std::size_t>> deferred_frees_;
  bool fences_stall_ = false;
  std::size_t segment_calls_ = 0, free_calls_ = 0, map_calls_ = 0, unmap_calls_ = 0;
  std::size_t remap_calls_ = 0, remapped_pages_ = 0, unsafe_unmaps_ = 0, bad_accesses_ = 0;
  std::size_t device_fences_ = 0, stream_fences_ = 0;
};

}  // namespace cudalloc
