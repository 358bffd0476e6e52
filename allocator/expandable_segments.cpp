// Growing and trimming expandable segments on virtual memory (see expandable_segments.h).
#include "allocator/expandable_segments.h"

#include <algorithm>

#include "allocator/allocator_stats.h"

namespace cudalloc {

Segment* ExpandableSegments::segment_for(StreamHandle stream, PoolKind kind) {
  auto it = by_key_.find({stream, kind});
  if (it != by_key_.end()) return it->second;
  // Address space is cheap and cannot be grown in place: the device's memory plus the limit,
  // so that live blocks left anywhere in the range never stop a request the limit allows
  // from finding a contiguous range once free chunks are given back.
  const std::size_t g = unit();
  const std::size_t va = (backend_.total_memory() + ledger_.device_limit() + g - 1) / g * g;
  DevicePtr base = 0;
  if (va == 0) return nullptr;
  if (const Status st = backend_.reserve_address(va, &base); st != Status::kOk) {
    ledger_.note_device_error(st);
    return nullptr;
  }
  Segment* s = segments_.add_expandable(base, va, kind, stream);
  blocks_.insert(s->first);
  add_stat(stats_.segment, kind, 1);
  by_key_.emplace(std::make_pair(stream, kind), s);
  return s;
}

Block* ExpandableSegments::grow(StreamHandle stream, std::size_t rounded, PoolKind kind) {
  Segment* s = segment_for(stream, kind);
  if (s == nullptr) return nullptr;
  const std::size_t g = unit();
  // The unmapped range that needs the fewest new bytes: a hole given back earlier may come
  // first, yet mapping the whole request there can pass the limit where growing behind a free
  // mapped block would not.
  Block* u = nullptr;
  std::size_t need = 0;
  for (Block* c = s->first; c != nullptr; c = c->next) {
    if (c->mapped || c->state != BlockState::kFree) continue;
    Block* before = c->prev;
    const std::size_t have =
        before != nullptr && before->mapped && before->state == BlockState::kFree ? before->size : 0;
    if (have + c->size < rounded) continue;
    const std::size_t n = std::min(c->size, (rounded - have + g - 1) / g * g);
    if (u == nullptr || n < need) {
      u = c;
      need = n;
    }
  }
  if (u == nullptr) return nullptr;
  if (stitching_ == PageStitching::kOn) {
    if (!stitch(s, u, need)) return nullptr;
    return blocks_.find(stream, rounded, kind);
  }
  if (!ledger_.claim(need)) return nullptr;
  if (const Status st = backend_.map(u->ptr, need); st != Status::kOk) {
    ledger_.unclaim(need);
    ledger_.note_device_error(st);
    return nullptr;
  }
  s->chunks.emplace(u->ptr, need);
  segments_.note_mapped(s, static_cast<std::ptrdiff_t>(need));
  ledger_.note_device_alloc(kind, stream, u->ptr, need);
  mapped_at(u, need);
  return blocks_.find(stream, rounded, kind);
}

void ExpandableSegments::mapped_at(Block* u, std::size_t bytes) {
  blocks_.erase(u);
  if (u->size > bytes) blocks_.insert(FreeBlocks::split_at(u, bytes));
  u->mapped = true;
  blocks_.make_reusable(u);  // joins the free block before it
}

std::vector<ExpandableSegments::PageRun> ExpandableSegments::free_page_runs(const Block* keep) const {
  const std::size_t g = unit();
  std::vector<PageRun> runs;
  for (const auto& [key, seg] : by_key_) {
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      if (b == keep || !b->mapped || b->state != BlockState::kFree) continue;
      // Pages lie at whole multiples of the unit from the segment's base.
      const DevicePtr lo = seg->base + (b->ptr - seg->base + g - 1) / g * g;
      const DevicePtr hi = seg->base + (b->ptr + b->size - seg->base) / g * g;
      if (hi > lo) runs.push_back(PageRun{b, lo, (hi - lo) / g});
    }
  }
  // Small holes first: a large free block is worth more where it is, to a large request.
  std::sort(runs.begin(), runs.end(), [](const PageRun& a, const PageRun& b) {
    return a.block->size != b.block->size ? a.block->size < b.block->size : a.first < b.first;
  });
  return runs;
}

// The free pages to move for `pages` pages at the unmapped block `u`, into `take`, and the
// claim for the rest, which is new memory. A page moves only once the device is done with its
// last block (UnmapClock). Pages the device may still use are waited for only where new memory
// would raise the peak or pass the limit: a drain of the device's queue at most once per new
// peak, not a wait per growth. False, having claimed nothing, if the rest cannot be claimed.
bool ExpandableSegments::choose_pages(const Block* u, std::size_t pages, std::vector<PageRun>& take,
                                      std::size_t& have) {
  const std::size_t g = unit();
  const std::vector<PageRun> runs = backend_.can_remap() ? free_page_runs(u->prev) : std::vector<PageRun>{};
  const auto pick = [&](bool safe_ones) {
    for (const PageRun& r : runs) {
      if (have == pages) break;
      if (clock_.safe(r.block->freed_era) != safe_ones) continue;
      const std::size_t n = std::min(r.pages, pages - have);
      take.push_back(PageRun{r.block, r.first, n});
      have += n;
    }
  };
  // Pages freed since the last fence get one now: a device that keeps up has passed it already.
  clock_.collect();
  if (std::any_of(runs.begin(), runs.end(), [&](const PageRun& r) { return !clock_.safe(r.block->freed_era); })) {
    clock_.close(backend_);
    clock_.collect();
  }
  pick(true);
  std::size_t fresh = pages - have;
  const bool raises_peak = segments_.bytes() + fresh * g > high_water_;
  if (fresh == 0 || (!raises_peak && ledger_.claim(fresh * g))) return true;
  const std::size_t before = take.size();
  pick(false);
  UnmapClock::Era wait_for = 0;
  for (std::size_t i = before; i < take.size(); ++i) wait_for = std::max(wait_for, take[i].block->freed_era);
  if (wait_for != 0) {
    ++stats_.num_remap_waits;
    if (!clock_.wait(backend_, wait_for)) {
      // The device cannot be waited for now: those pages stay where they are.
      for (std::size_t i = before; i < take.size(); ++i) have -= take[i].pages;
      take.resize(before);
    }
  }
  fresh = pages - have;
  return fresh == 0 || ledger_.claim(fresh * g);
}

// Reserved memory follows live memory page by page: a request that finds no contiguous free
// range gets the free pages of other blocks, wherever they lie, mapped side by side at the
// growth point, and new memory only for what they cannot cover.
bool ExpandableSegments::stitch(Segment* s, Block* u, std::size_t need) {
  const std::size_t g = unit();
  const std::size_t pages = need / g;
  std::vector<PageRun> take;
  std::size_t have = 0;
  // Below the most ever held, new memory raises no peak and costs fewer calls than moving pages
  // (each its own unmap and map); a program that cycles through the same shapes settles there.
  const bool below_peak = segments_.bytes() + need <= high_water_ && ledger_.claim(need);
  if (!below_peak && !choose_pages(u, pages, take, have)) return false;
  std::size_t fresh = pages - have;
  const DevicePtr fresh_at = u->ptr + have * g;
  if (fresh > 0) {
    if (const Status st = backend_.map_pages(fresh_at, fresh * g, g); st != Status::kOk) {
      ledger_.unclaim(fresh * g);
      ledger_.note_device_error(st);
      return false;
    }
  }
  if (have > 0) {
    std::vector<DevicePtr> from;
    from.reserve(have);
    for (const PageRun& t : take) {
      for (std::size_t i = 0; i < t.pages; ++i) from.push_back(t.first + i * g);
    }
    if (backend_.remap(from, u->ptr, g) == Status::kOk) {
      ++stats_.num_remaps;
      stats_.num_remapped_pages += static_cast<std::int64_t>(have);
    } else {
      // Nothing moved: the request gets new memory instead, as without stitching.
      const bool claimed_rest = ledger_.claim(have * g);
      if (!claimed_rest || backend_.map_pages(u->ptr, have * g, g) != Status::kOk) {
        if (claimed_rest) ledger_.unclaim(have * g);
        if (fresh > 0 && backend_.unmap(fresh_at, fresh * g) == Status::kOk) ledger_.unclaim(fresh * g);
        return false;
      }
      take.clear();
      fresh = pages;
      have = 0;
    }
  }
  // Every count changes before any observer hears of it, so that none sees the moved pages
  // counted twice (or not at all) in the memory held.
  for (std::size_t i = 0; i < pages; ++i) s->chunks.emplace(u->ptr + i * g, g);
  segments_.note_mapped(s, static_cast<std::ptrdiff_t>(need));
  for (const PageRun& t : take) {
    Segment* from = t.block->segment;
    for (std::size_t i = 0; i < t.pages; ++i) from->chunks.erase(t.first + i * g);
    segments_.note_mapped(from, -static_cast<std::ptrdiff_t>(t.pages * g));
  }
  // The sources first: mapped, the target would absorb a free source block right after it;
  // a source's range, unmapped, joins `u` instead, which stays the block at its address.
  const DevicePtr at = u->ptr;
  for (const PageRun& t : take) {
    const PoolKind kind = t.block->segment->pool;
    const StreamHandle stream = t.block->segment->stream;
    pages_left(t.block, t.first, t.pages);
    ledger_.note_pages_out(kind, stream, t.first, t.pages * g);
  }
  mapped_at(u, need);
  if (have > 0) ledger_.note_pages_in(s->pool, s->stream, at, have * g);
  if (fresh > 0) ledger_.note_device_alloc(s->pool, s->stream, at + have * g, fresh * g);
  high_water_ = std::max(high_water_, segments_.bytes());
  return true;
}

void ExpandableSegments::pages_left(Block* b, DevicePtr first, std::size_t n) {
  const std::size_t bytes = n * unit();
  blocks_.erase(b);
  Block* gone = b;
  if (first > b->ptr) {
    gone = FreeBlocks::split_at(b, first - b->ptr);
    blocks_.insert(b);
  }
  if (gone->size > bytes) blocks_.insert(FreeBlocks::split_at(gone, bytes));
  gone->mapped = false;
  blocks_.make_reusable(gone);  // joins neighbouring unmapped ranges
}

// The free block that holds the whole mapped chunk [start, start+bytes) of `s`, or null.
Block* ExpandableSegments::free_block_around(const Segment& s, DevicePtr start, std::size_t bytes) {
  Block* b = SegmentTable::block_containing(s, start);
  const bool inside = b != nullptr && b->mapped && b->state == BlockState::kFree && start + bytes <= b->ptr + b->size;
  return inside ? b : nullptr;
}

// Gives back every mapped chunk of `s` that lies inside a free block. The caller has waited
// for the device: a free block may still be read by work queued before its free.
std::size_t ExpandableSegments::unmap_free_chunks(Segment* s, std::size_t stop_below) {
  std::size_t released = 0;
  for (auto it = s->chunks.begin(); it != s->chunks.end() && segments_.bytes() > stop_below;) {
    const auto [start, bytes] = *it;
    Block* b = free_block_around(*s, start, bytes);
    if (b == nullptr || backend_.unmap(start, bytes) != Status::kOk) {
      ++it;
      continue;
    }
    blocks_.erase(b);
    if (b->ptr + b->size > start + bytes) blocks_.insert(FreeBlocks::split_at(b, start + bytes - b->ptr));
    Block* gone = b->ptr < start ? FreeBlocks::split_at(b, start - b->ptr) : b;
    if (gone != b) blocks_.insert(b);
    gone->mapped = false;
    blocks_.make_reusable(gone);  // joins neighbouring unmapped ranges
    segments_.note_mapped(s, -static_cast<std::ptrdiff_t>(bytes));
    ledger_.note_device_free(s->pool, s->stream, start, bytes);
    ledger_.unclaim(bytes);  // the device took it back (a failed unmap keeps its claim)
    released += bytes;
    it = s->chunks.erase(it);
  }
  return released;
}

// One wait on a device fence covers every segment. A stream fence would not be enough even
// for a segment of one stream: a block of any segment may have been cudaFree'd, and a device
// fence that orders reuse (backend.h) let it go back to the pool before its work ran.
std::size_t ExpandableSegments::unmap_all_free_chunks(std::size_t stop_below) {
  if (segments_.bytes() <= stop_below) return 0;
  // No wait for the device when nothing could be given back (garbage collection asks often).
  const bool any = std::any_of(by_key_.begin(), by_key_.end(), [this](const auto& entry) {
    const Segment* s = entry.second;
    return std::any_of(s->chunks.begin(), s->chunks.end(),
                       [&](const auto& chunk) { return free_block_around(*s, chunk.first, chunk.second) != nullptr; });
  });
  if (!any || !backend_.record_device_fence()->wait()) return 0;
  std::size_t released = 0;
  for (auto& [key, s] : by_key_) released += unmap_free_chunks(s, stop_below);
  std::erase_if(by_key_, [this](const auto& entry) { return release_address(entry.second); });
  return released;
}

// A segment with nothing mapped gives its address range back: each holds the device's memory
// plus the limit in address space, and streams that come and go would otherwise use it all up.
bool ExpandableSegments::release_address(Segment* s) {
  Block* b = s->first;
  if (!s->chunks.empty() || b == nullptr || b->next != nullptr || b->mapped || b->state != BlockState::kFree) {
    return false;
  }
  if (backend_.free_address(s->base, s->size) != Status::kOk) return false;
  blocks_.erase(b);
  sub_stat(stats_.segment, s->pool, 1);
  segments_.remove(s);
  return true;
}

}  // namespace cudalloc
