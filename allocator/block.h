// Blocks and the segments they are cut from.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "allocator/memory_stats.h"
#include "allocator/types.h"

namespace cudalloc {

struct Segment;

enum class BlockState : std::uint8_t {
  kFree,       // in a pool, reusable
  kAllocated,  // held by the program
  kPending,    // freed, waiting for device work queued before the free
  kCached,     // free, held in a thread's cache for reuse on its stream
};

// A field the hot path writes without the allocator's lock while the locked path may read (or,
// for a live block's buffer id, write) it: a relaxed atomic makes that access defined, at the
// cost of a plain load or store. Copyable, as the block is.
template <typename T>
class RelaxedCell {
 public:
  RelaxedCell(T v = T{}) : v_(v) {}
  RelaxedCell(const RelaxedCell& o) : v_(o.load()) {}
  RelaxedCell& operator=(const RelaxedCell& o) { v_.store(o.load(), std::memory_order_relaxed); return *this; }
  RelaxedCell& operator=(T v) { v_.store(v, std::memory_order_relaxed); return *this; }
  operator T() const { return load(); }
  T load() const { return v_.load(std::memory_order_relaxed); }
  // A store that publishes the plain writes before it to a load_acquire() that sees it.
  void store_release(T v) { v_.store(v, std::memory_order_release); }
  T load_acquire() const { return v_.load(std::memory_order_acquire); }

 private:
  std::atomic<T> v_;
};

// The hot path moves a block it owns between allocated, cached and pending without the
// allocator's lock, while the locked path may read that state when it coalesces a neighbour.
// Only the locked path ever sets kFree.
using BlockStateCell = RelaxedCell<BlockState>;

// A contiguous piece of a segment. Blocks of a segment form an address-ordered list.
// A cache line of its own: threads of cudaMalloc take neighbouring blocks of one segment, and
// blocks sharing a line would make their threads invalidate each other's lines.
//
// The first line holds what a cached allocate, free and refill read and write; the links and
// the segment, which only the locked path follows, are on the second. (A cudaFree'd block waits
// behind hundreds of others for its fence, so each line a pair touches is a likely miss.)
struct alignas(64) Block {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  StreamHandle stream = 0;                // the pool it belongs to (that of its segment)
  std::vector<StreamHandle> stream_uses;  // other streams the program used it on
  BlockStateCell state;
  PoolKind pool = PoolKind::kSmall;       // its segment's, copied here for the hot path
  bool mapped = true;                     // false: unbacked address space of an expandable segment
  // Cleared at each hand-out; set when the hand-out's buffer id is first asked for. A one-byte
  // store beside `state` is all a cached allocate pays for buffer ids (buffer_id, below).
  RelaxedCell<bool> has_buffer_id;
  int pending_fences = 0;                 // fences still to complete before reuse
  // ---- second line
  Segment* segment = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  const void* taker = nullptr;            // the thread cache of the thread that took it last
  Block* cached_next = nullptr;           // the next block of its thread-cache bin, while cached
  // CU_POINTER_ATTRIBUTE_BUFFER_ID of the current hand-out, valid while has_buffer_id: taken
  // from a process-wide counter when first asked for (DeviceAllocator::find), under the lock.
  std::uint64_t buffer_id = 0;
  // Expandable segments: the UnmapClock era in which it last became free (a merged block, the
  // latest of its parts'); its whole pages may move elsewhere once that era is safe.
  std::uint32_t freed_era = 0;

  bool is_split() const { return prev != nullptr || next != nullptr; }
};
static_assert(offsetof(Block, pending_fences) + sizeof(int) <= 64, "the hot fields fill the first line");
static_assert(sizeof(RelaxedCell<bool>) == 1 && offsetof(Block, has_buffer_id) < offsetof(Block, pending_fences),
              "has_buffer_id fills the first line's padding");

// One allocation from the device, cut into blocks. An expandable segment is instead a range of
// reserved address space, mapped chunk by chunk as it grows; its blocks cover the whole range.
struct Segment {
  DevicePtr base = 0;
  std::size_t size = 0;          // address space covered
  bool expandable = false;
  std::size_t mapped_bytes = 0;  // expandable: bytes backed by device memory
  std::map<DevicePtr, std::size_t> chunks;  // expandable: each map() call, by address
  PoolKind pool = PoolKind::kSmall;
  StreamHandle stream = 0;
  Block* first = nullptr;
  std::uint64_t idle_since = 0;  // allocator tick when it last became wholly free

  // Memory it holds from the device.
  std::size_t reserved() const { return expandable ? mapped_bytes : size; }
  // A plain segment that is wholly free: one block, in a pool.
  bool idle() const {
    return !expandable && first != nullptr && first->next == nullptr && first->state == BlockState::kFree;
  }
};

}  // namespace cudalloc
