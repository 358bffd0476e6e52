// The program's own virtual-memory allocations, cached as mapped pairs: the policy, with no
// driver call (driver/vmm_cache.h runs the driver calls it asks for).
//
// A program that manages device memory with the virtual memory calls (XLA without its BFC pool)
// makes every buffer with cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess and
// frees it with cuMemUnmap + cuMemRelease + cuMemAddressFree: seven driver calls per buffer.
// A *pair* is a range R reserved for the program and wholly mapped (offset 0, whole size) to a
// physical allocation P of the same size. When the program has given up R, P and the mapping,
// the pair stays mapped, with its access, in this cache; the program's next reserve or create
// of that size gets the pair's R or P, and its map and set-access of exactly that pair become
// no-ops.
//
// Program-visible state against actual state. For each pair the cache knows what the program
// believes: whether it holds R (reserved, not freed), holds P (created, not released) and has R
// mapped. The driver's state is always "R mapped to P, with `access`". A call that fits the
// pattern only changes the program's side. A call that does not fit (a map of something else
// into a lent R, a partial unmap, a map of P elsewhere) first *detaches* the pair: the caller
// runs the real calls that make the driver's state what the program believes (unmap R if the
// program has it unmapped, release P if the program released it, free R if the program freed
// it), and the pair is forgotten; then the program's call goes to the driver, which answers it
// as it would have without the cache.
//
// Pairs the program made with real calls are adopted: a plain range the program reserved,
// wholly mapped to a plain handle the program created, of the same size, is a pair from then on.
//
// Reuse. The program's work queued before it unmapped R may still use P. The unmap is stamped
// with the open free epoch; a device fence closes the epoch, and a pair leaves the pending list
// for the ready list once the fence of its epoch has completed. The epoch is closed when a
// request finds pending pairs of its size but no ready one: one fence for every pair given
// back since the last one, none in a steady state where ready pairs suffice.
//
// Thread safety: every call takes the cache's mutex; fences are recorded and queried under it
// (non-blocking driver calls), the detaching driver calls are the caller's, made afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "allocator/backend.h"

namespace cudalloc {

using VmAddress = std::uint64_t;  // a CUdeviceptr
using VmHandle = std::uint64_t;   // a CUmemGenericAllocationHandle

// One access descriptor: where (the caller packs the location's type and id) and how.
struct VmAccess {
  std::uint64_t location = 0;
  std::uint64_t flags = 0;
  bool operator==(const VmAccess&) const = default;
};

// A real driver call that the caller makes, in order, before the program's own call.
struct VmOp {
  enum class Kind : std::uint8_t { kUnmap, kRelease, kAddressFree };
  Kind kind;
  VmAddress address = 0;  // kUnmap, kAddressFree
  std::size_t size = 0;   // kUnmap, kAddressFree
  VmHandle handle = 0;    // kRelease
};

// What to do with one of the program's calls.
struct VmDecision {
  // Served: the program's view changed, no driver call is due. Otherwise run `settle`, then
  // pass the program's call to the driver.
  bool served = false;
  std::vector<VmOp> settle;
};

struct VmmStats {
  std::uint64_t create_hits = 0;     // cuMemCreate answered with a cached pair's handle
  std::uint64_t create_misses = 0;   // plain cuMemCreate passed to the driver
  std::uint64_t reserve_hits = 0;    // cuMemAddressReserve answered with a cached pair's range
  std::uint64_t reserve_misses = 0;  // plain cuMemAddressReserve passed to the driver
  std::uint64_t calls_served = 0;    // map, set-access, unmap, release, address-free not made
  std::uint64_t adopted = 0;         // pairs formed from the program's real calls
  std::uint64_t detached = 0;        // pairs handed back to the program's own state (a call that did not fit)
  std::uint64_t released = 0;        // cached pairs given back to the driver (pressure, trim)
  std::uint64_t fences = 0;          // epochs closed with a fence
  std::size_t ready_pairs = 0;
  std::size_t ready_bytes = 0;
  std::size_t pending_pairs = 0;     // given back, waiting for their fence
  std::size_t pending_bytes = 0;
  std::size_t program_pairs = 0;     // pairs the program holds some part of
  std::size_t peak_cached_bytes = 0;
  VmmStats& operator+=(const VmmStats& o);
};

class VmmPairs {
 public:
  // Records a fence after all device work queued so far that may use this device's memory.
  using FenceRecorder = std::function<std::unique_ptr<Fence>()>;
  VmmPairs(int device, FenceRecorder record_fence);
  VmmPairs(const VmmPairs&) = delete;
  VmmPairs& operator=(const VmmPairs&) = delete;

  // cuMemAddressReserve(size, alignment) at no fixed address: a pair's range, the program's from
  // now on (still mapped, which the program does not know); nullopt when none fits.
  std::optional<VmAddress> lend_range(std::size_t size, std::size_t alignment);
  // The driver reserved [base, base + size) for a plain request: a range that may become a pair.
  void note_reserved(VmAddress base, std::size_t size);
  // cuMemCreate(size) with a plain property of this device: a pair's handle; nullopt when none.
  // A pair whose range the program took first is preferred, most recent first.
  std::optional<VmHandle> lend_handle(std::size_t size);
  // The driver created `h` for a plain request.
  void note_created(VmHandle h, std::size_t size);

  VmDecision map(VmAddress va, std::size_t size, std::size_t offset, VmHandle h);
  // The driver mapped it (after an unserved map): a whole mapping of a plain range to a plain
  // handle of its size is adopted as a pair.
  void note_mapped(VmAddress va, std::size_t size, std::size_t offset, VmHandle h);
  VmDecision unmap(VmAddress va, std::size_t size);
  VmDecision set_access(VmAddress va, std::size_t size, std::span<const VmAccess> access);
  // The driver set it (after an unserved set-access): the pair's access, as the driver has it.
  void note_access(VmAddress va, std::size_t size, std::span<const VmAccess> access);
  VmDecision release(VmHandle h);
  VmDecision address_free(VmAddress va, std::size_t size);
  // The program asks about the mapping at `va` in a way the cache does not model
  // (cuMemRetainAllocationHandle): the pair there goes back to the program's own state.
  VmDecision expose(VmAddress va);
  // The program exported the handle (cuMemExportToShareableHandle): another process may map it,
  // so it must never serve another request. Its pair, if any, goes back to the program's state.
  VmDecision expose_handle(VmHandle h);

  // Every cached pair, ready or pending, leaves the cache: the real calls that give them back.
  // Pending ones too: the program gave them up, which natively it did with these very calls.
  std::vector<VmOp> release_cached(std::size_t* bytes = nullptr);

  int device() const { return device_; }
  bool used() const;
  VmmStats stats() const;
  // Lines for the CUDALLOC_STATS summary.
  std::string summary() const;

 private:
  enum class List : std::uint8_t { kNone, kRangeLent, kHandleLent, kPending, kReady };
  struct Range {
    std::size_t size = 0;
    bool held = true;     // the program has it reserved
    bool paired = false;  // a pair's range (pairs_ at the same base)
  };
  struct Handle {
    std::size_t size = 0;
    bool held = true;     // the program has not released it
    bool shared = false;  // mapped outside a pair, or retained: never a pair
    VmAddress pair = 0;   // the range of its pair; 0: none
  };
  struct Pair {
    VmHandle handle = 0;
    std::size_t size = 0;
    bool mapped = true;            // the program sees the range mapped
    std::vector<VmAccess> access;  // what the driver has set on the range
    std::uint64_t epoch = 0;       // the free epoch of the program's last unmap; 0: none
    List list = List::kNone;
  };

  // The pair containing `va` (its range base); nullopt if none.
  std::optional<VmAddress> pair_at(VmAddress va) const;
  bool clean(const Pair& p) const { return p.epoch <= done_epoch_; }
  // Puts the pair on the list its program-side state says; takes it off its old one.
  void place(VmAddress base, Pair& p);
  void unlist(VmAddress base, Pair& p);
  // The pair leaves the cache; appends the real calls that make the driver's state the program's.
  void detach(VmAddress base, std::vector<VmOp>& settle);
  void detach_overlapping(VmAddress va, std::size_t size, std::vector<VmOp>& settle);
  void close_epoch();
  void poll();
  // A ready pair of `size` whose range is aligned to `alignment`, taken off the ready list.
  std::optional<VmAddress> take_ready(std::size_t size, std::size_t alignment);

  const int device_;
  const FenceRecorder record_fence_;
  mutable std::mutex mutex_;  // everything below
  std::map<VmAddress, Range> ranges_;
  std::unordered_map<VmHandle, Handle> handles_;
  std::unordered_map<VmAddress, Pair> pairs_;
  std::map<std::size_t, std::vector<VmAddress>> ready_;  // by size, most recently given back last
  std::multimap<std::uint64_t, VmAddress> pending_;      // by epoch
  std::unordered_map<std::size_t, std::size_t> pending_sizes_;
  std::vector<VmAddress> range_lent_;   // the program holds the range only; most recent last
  std::vector<VmAddress> handle_lent_;  // the program holds the handle only
  std::deque<std::pair<std::uint64_t, std::unique_ptr<Fence>>> fences_;  // oldest first
  std::uint64_t open_epoch_ = 1;
  std::uint64_t done_epoch_ = 0;
  std::size_t open_pairs_ = 0;  // pairs unmapped in the open epoch
  VmmStats stats_;
};

}  // namespace cudalloc
