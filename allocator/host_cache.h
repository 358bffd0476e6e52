// A cache of page-locked (pinned) host memory: cuMemHostAlloc / cuMemAllocHost / cuMemFreeHost,
// so cudaHostAlloc, cudaMallocHost and cudaFreeHost.
//
// Size classes. Requests are rounded to a class and served whole-block from that class's free
// list, never split or coalesced:
//   - up to 1 MiB: the next power of two, at least 4 KiB (PyTorch's CachingHostAllocator rounds
//     to powers of two too; 4 KiB keeps every block page-aligned, which programs that hand
//     pinned buffers to O_DIRECT I/O rely on);
//   - above 1 MiB: four steps per power of two (1.25, 1.5, 1.75, 2 x), so a large buffer pins at
//     most a quarter more than asked, where power-of-two rounding could pin nearly twice as much
//     of the host's physical memory.
// Blocks of at most 128 KiB are cut from one driver allocation (a segment) of 16 blocks of their
// class, at least 64 KiB: one page-locking call serves 16 requests. Larger blocks are a segment
// each. A block is therefore inside a bigger driver allocation; what the driver reports for a
// pointer (its range, its buffer id) is the segment's, and the shim fixes up what must be the
// block's.
//
// Flags. Each flag set (CU_MEMHOSTALLOC_PORTABLE, _DEVICEMAP, _WRITECOMBINED and their
// combinations) has free lists of its own, and segments are allocated with the flags of the
// request that made them: a block never serves a request with other flags.
//
// Reuse. cudalloc does not see which streams copy from or to a pinned block, so a freed block is
// reused only after every device's work queued before its free has run: frees join an open
// batch (no driver call, never a wait), and the batch is closed by a fence for the whole
// device(s) (HostBackend::record_fence) when an allocation of its class finds no ready block.
// The block serves again once that fence is done; until then such an allocation makes new
// memory rather than wait. Only trimming and memory pressure wait for fences.
//
// Locking. A cached allocation and a free take the lock of their class (per flag set and size
// class) and, for a free, a shared lock on the segment index; nothing the device allocator
// takes. A miss makes its driver calls with no lock held.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "allocator/backend.h"
#include "allocator/events.h"
#include "allocator/types.h"

namespace cudalloc {

// Where pinned memory comes from: the driver (driver/host_backend.h) or a test's fake.
class HostBackend {
 public:
  virtual ~HostBackend() = default;
  // Page-locked memory of `bytes` with the cuMemHostAlloc `flags`. kOutOfMemory when the host
  // or the driver has none; kBackendError (the driver's error kept by the backend) otherwise.
  virtual Status allocate(std::size_t bytes, unsigned flags, void** out) = 0;
  virtual Status free(void* ptr) = 0;
  // A fence after all work queued so far on every stream of every device that may use pinned
  // memory. Must not block.
  virtual std::unique_ptr<Fence> record_fence() = 0;
};

// The pinned memory all caches of the process may hold together (pinned_memory_limit_mb).
class HostBudget {
 public:
  explicit HostBudget(std::size_t limit = 0) : limit_(limit) {}
  void set_limit(std::size_t limit) { limit_ = limit; }
  std::size_t limit() const { return limit_; }
  // Takes `bytes` unless that would pass the limit (0: none).
  bool take(std::size_t bytes);
  void give(std::size_t bytes) { held_.fetch_sub(bytes, std::memory_order_relaxed); }
  std::size_t held() const { return held_.load(std::memory_order_relaxed); }

 private:
  std::size_t limit_;
  std::atomic<std::size_t> held_{0};
};

struct HostCacheStats {
  std::size_t in_use_bytes = 0;     // blocks handed out (their class sizes)
  std::size_t requested_bytes = 0;  // what was asked for them
  std::size_t reserved_bytes = 0;   // segments held from the driver
  std::size_t peak_reserved_bytes = 0;
  std::size_t pending_bytes = 0;    // freed, waiting for their fence
  std::uint64_t in_use_blocks = 0;
  std::uint64_t allocations = 0;    // successful
  std::uint64_t hits = 0;           // served from cached memory (fenced reuse included)
  std::uint64_t fenced_hits = 0;    // of which served once a fence checked at the miss was done
  std::uint64_t misses = 0;         // needed a new segment
  std::uint64_t frees = 0;
  std::uint64_t driver_allocs = 0;  // segments allocated
  std::uint64_t driver_frees = 0;   // segments given back
  std::uint64_t fences = 0;         // batches closed with a fence
  std::uint64_t ooms = 0;           // requests refused for the driver or the limit
};

// A live block, as the pointer queries see it.
struct HostBlockInfo {
  void* base = nullptr;       // the block
  std::size_t size = 0;       // its class size
  std::size_t requested = 0;
  unsigned flags = 0;         // the request's flags (the segment's)
  void* segment_base = nullptr;
  std::size_t segment_size = 0;
  std::uint64_t buffer_id = 0;  // unique per hand-out
};

class HostCache {
 public:
  // Flags cudalloc caches: every combination of the three cuMemHostAlloc flags.
  static constexpr unsigned kFlagMask = 0x7;
  static constexpr std::size_t kFlagSets = 8;
  static constexpr std::size_t kMinBlock = 4 * kKiB;
  static constexpr std::size_t kLargestSlabBlock = 128 * kKiB;  // larger: a segment each
  static constexpr std::size_t kMaxRequest = std::size_t{1} << 46;

  // The class of a request, and its size. Requests of 0 bytes or above kMaxRequest have none.
  static std::optional<unsigned> class_of(std::size_t bytes);
  static std::size_t class_size(unsigned cls);
  static std::size_t segment_size(std::size_t block_size);

  HostCache(HostBackend& backend, HostBudget& budget, int device);
  ~HostCache();
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;

  // Who hears of host_alloc/host_free and segment records (the trace); null for none. Set once,
  // before the first allocation.
  void set_observer(AllocatorObserver* o) { observer_ = o; }
  // Called when new memory is refused (the driver's out-of-memory or the limit), with no lock
  // held: gives back idle cached memory (this cache's and others'); whether any went.
  void set_reclaimer(std::function<bool()> f) { reclaimer_ = std::move(f); }

  // Whether `flags` and `bytes` are a request this cache serves (else: the driver's).
  static bool cacheable(std::size_t bytes, unsigned flags) {
    return (flags & ~kFlagMask) == 0 && class_of(bytes).has_value();
  }
  // A cacheable request. kOutOfMemory after giving back what was idle; kBackendError with the
  // backend's error otherwise. `hit` (optional): served without a driver allocation.
  Status allocate(std::size_t bytes, unsigned flags, void** out, bool* hit = nullptr);

  enum class Lookup { kNotOwned, kFreed, kLive };
  // Frees the block that starts at `p`. kNotOwned: no segment of this cache holds `p` (the
  // driver's); kFreed: it does, but no live block starts there (a double free, an interior
  // pointer), and nothing changes.
  Lookup free(void* p);
  // The live block containing `p` (any byte of it).
  Lookup find(const void* p, HostBlockInfo* info);
  // Whether some segment of this cache holds `p`. Cheap while the cache is empty.
  bool owns(const void* p) const;

  // Gives back every idle segment; `wait`: first closes the open batches and waits for all
  // fences (false: only those already done count). Returns the bytes given back.
  std::size_t release_cached(bool wait);
  // The context is gone and its pinned memory with it: forget every segment, no driver call.
  void forget_all();

  HostCacheStats stats() const;
  bool used() const { return used_.load(std::memory_order_relaxed); }
  // Lines for the CUDALLOC_STATS summary.
  std::string summary() const;

 private:
  struct Segment;
  struct Block {
    Segment* segment = nullptr;
    char* ptr = nullptr;
    std::size_t requested = 0;
    std::uint64_t buffer_id = 0;  // taken at the first query of a hand-out
    enum class State : std::uint8_t { kReady, kLive, kPending } state = State::kReady;
  };
  struct Segment {
    char* base = nullptr;
    std::size_t bytes = 0;
    std::size_t block_size = 0;
    unsigned flags = 0;
    unsigned cls = 0;
    std::size_t ready = 0;  // blocks in the ready state (under the class lock)
    std::vector<Block> blocks;
  };
  struct Batch {
    std::vector<Block*> blocks;
    std::unique_ptr<Fence> fence;
  };
  struct alignas(64) SizeClass {
    std::mutex mutex;
    std::vector<Block*> ready;  // last freed first: its pages are warm
    std::vector<Block*> open;   // freed since the last fence
    std::vector<Batch> fenced;  // oldest first
    // Counters, under the mutex (summed by stats()).
    std::size_t in_use_bytes = 0;
    std::size_t requested_bytes = 0;
    std::size_t pending_bytes = 0;
    std::uint64_t in_use_blocks = 0;
    std::uint64_t allocations = 0;
    std::uint64_t hits = 0;
    std::uint64_t fenced_hits = 0;
    std::uint64_t frees = 0;
    std::uint64_t fences = 0;
  };
  struct FlagSet {
    std::vector<SizeClass> classes;
  };

  SizeClass& size_class(unsigned flags, unsigned cls);
  SizeClass* existing_class(unsigned flags, unsigned cls) const;
  // Takes a ready block, after polling fences and closing the open batch; null if none.
  Block* take_locked(SizeClass& c, bool* fenced);
  void poll_locked(SizeClass& c);
  void close_batch_locked(SizeClass& c);
  void hand_out_locked(SizeClass& c, Block* b, std::size_t bytes);
  Status new_segment(unsigned flags, unsigned cls, Segment** out);
  std::size_t release_locked(bool wait);
  void notify(EventKind kind, const void* ptr, std::size_t requested, std::size_t rounded, bool hit,
              Status result = Status::kOk) const;

  HostBackend& backend_;
  HostBudget& budget_;
  int device_;
  AllocatorObserver* observer_ = nullptr;
  std::function<bool()> reclaimer_;
  std::atomic<bool> used_{false};
  std::mutex flagsets_mutex_;  // making a flag set's classes
  std::array<std::atomic<FlagSet*>, kFlagSets> flagsets_{};
  // The segment index, by base. Shared: frees and queries; exclusive: a segment made or given
  // back. Taken before any class lock.
  mutable std::shared_mutex segments_mutex_;
  std::map<std::uintptr_t, std::unique_ptr<Segment>> segments_;
  std::atomic<std::size_t> segment_count_{0};
  std::atomic<std::size_t> reserved_{0};
  std::atomic<std::size_t> peak_reserved_{0};
  std::atomic<std::uint64_t> misses_{0};
  std::atomic<std::uint64_t> driver_allocs_{0};
  std::atomic<std::uint64_t> driver_frees_{0};
  std::atomic<std::uint64_t> ooms_{0};
};

}  // namespace cudalloc
