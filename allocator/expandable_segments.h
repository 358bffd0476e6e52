// Expandable segments: one range of reserved address space per (stream, pool), mapped chunk by
// chunk as it grows, so that a large block finds room at the growth point instead of a new
// segment being cut; under pressure the chunks inside free blocks are unmapped again. This is
// the only code that talks to the backend's virtual-memory calls, so it is kept apart from the
// plain segments and the allocation ladder. It owns the per-(stream, pool) index of those
// segments; the segments and blocks themselves live in the SegmentTable and FreeBlocks it is
// given, and what mapping changes means for the limit, the statistics and the observer is the
// SegmentLedger's business. Used under the device lock only.
#pragma once

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "allocator/backend.h"
#include "allocator/block.h"
#include "allocator/free_blocks.h"
#include "allocator/memory_stats.h"
#include "allocator/segment_table.h"
#include "allocator/unmap_clock.h"

namespace cudalloc {

// What getting and giving back device memory reports to the allocator around it (the device
// allocator implements it). Called on the slow paths only, next to a driver call.
class SegmentLedger {
 public:
  // The reservation limit in force.
  virtual std::size_t device_limit() const = 0;
  // Takes `bytes` of the limit for memory about to be asked of the device; false, taking
  // nothing, when that would pass the limit. unclaim() gives them back if the device refuses,
  // or once the device has taken the memory back (not before: another context could claim
  // the room while the device still held the memory).
  virtual bool claim(std::size_t bytes) = 0;
  virtual void unclaim(std::size_t bytes) = 0;
  // `bytes` at `ptr` were just taken from (given back to) the device for a segment of `kind`
  // on `stream`; the segment table already counts the change. The claim is the caller's.
  virtual void note_device_alloc(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) = 0;
  virtual void note_device_free(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) = 0;
  // The device refused memory with `error`, not for want of it (see out_of_memory.h).
  virtual void note_device_error(Status error) = 0;
  // Physical pages moved (page stitching): `bytes` at `ptr` of a segment of `kind` on `stream`
  // left, or arrived. The memory held from the device does not change.
  virtual void note_pages_out(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) = 0;
  virtual void note_pages_in(PoolKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) = 0;

 protected:
  ~SegmentLedger() = default;
};

// Whether growth may take the free pages of other blocks instead of new memory.
enum class PageStitching : bool { kOff, kOn };

class ExpandableSegments {
 public:
  // `page`: with stitching, the bytes of one physical allocation, the unit pages move in (0: the
  // backend's granularity; else a multiple of it).
  ExpandableSegments(SegmentBackend& backend, SegmentTable& segments, FreeBlocks& blocks, MemoryStats& stats,
                     SegmentLedger& ledger, PageStitching stitching = PageStitching::kOff, std::size_t page = 0)
      : backend_(backend), segments_(segments), blocks_(blocks), stats_(stats), ledger_(ledger), stitching_(stitching),
        page_(page) {
    if (stitching_ == PageStitching::kOn) blocks_.set_unmap_clock(&clock_);
  }
  ExpandableSegments(const ExpandableSegments&) = delete;
  ExpandableSegments& operator=(const ExpandableSegments&) = delete;

  // Maps just enough of the first unmapped range of the (stream, kind) segment that, with the
  // free mapped block before it, holds the request; returns a block for it, out of its pool.
  Block* grow(StreamHandle stream, std::size_t rounded, PoolKind kind);
  // Unmaps the chunks inside free blocks of every expandable segment, until the allocator
  // holds no more than `stop_below`, and frees the address range of a segment left with
  // nothing mapped. Returns the bytes given back.
  std::size_t unmap_all_free_chunks(std::size_t stop_below = 0);
  // Forgets the index (the segment table forgets the segments).
  void clear() {
    by_key_.clear();
    clock_.all_safe();
  }

 private:
  // The segment of (stream, kind), reserved on first use; null if no address space is left.
  Segment* segment_for(StreamHandle stream, PoolKind kind);
  std::size_t unmap_free_chunks(Segment* s, std::size_t stop_below);
  // Frees the address range of a segment with nothing mapped, and forgets the segment.
  bool release_address(Segment* s);
  static Block* free_block_around(const Segment& s, DevicePtr start, std::size_t bytes);
  // Page stitching: the whole pages inside free mapped blocks that could move, but those of
  // `keep`; each run of them in one block, smallest blocks first.
  struct PageRun {
    Block* block;
    DevicePtr first;
    std::size_t pages;
  };
  std::vector<PageRun> free_page_runs(const Block* keep) const;
  // Maps `need` bytes at the start of the unmapped block `u` of `s`, taking as many pages as it
  // can from other free blocks and making the rest new. False, changing nothing, if it cannot.
  bool stitch(Segment* s, Block* u, std::size_t need);
  bool choose_pages(const Block* u, std::size_t pages, std::vector<PageRun>& take, std::size_t& have);
  // Turns the pages [first, first + n granules) of the free mapped block `b` into unmapped
  // address space, their physical pages having moved away.
  void pages_left(Block* b, DevicePtr first, std::size_t n);
  // Marks `bytes` at the start of the unmapped block `u` as mapped, joined to the free block
  // before it.
  void mapped_at(Block* u, std::size_t bytes);

  SegmentBackend& backend_;
  SegmentTable& segments_;
  FreeBlocks& blocks_;
  MemoryStats& stats_;
  SegmentLedger& ledger_;
  std::map<std::pair<StreamHandle, PoolKind>, Segment*> by_key_;
  const PageStitching stitching_;
  const std::size_t page_;
  // The unit segments are reserved and mapped in: the stitching page, else the granularity.
  std::size_t unit() const {
    const std::size_t g = backend_.vm_granularity();
    return stitching_ == PageStitching::kOn && page_ > g ? page_ / g * g : g;
  }
  UnmapClock clock_;
  std::size_t high_water_ = 0;  // the most memory stitching growth has held
};

}  // namespace cudalloc
