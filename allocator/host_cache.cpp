#include "allocator/host_cache.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <set>

#include "allocator/memory_stats.h"

namespace cudalloc {

namespace {

constexpr unsigned kSmallClasses = 9;  // 4 KiB .. 1 MiB
constexpr unsigned kFirstLargeExp = 20;
constexpr unsigned kLastLargeExp = 45;  // requests up to 2^46
constexpr unsigned kClasses = kSmallClasses + (kLastLargeExp - kFirstLargeExp + 1) * 4;
constexpr std::size_t kBlocksPerSlab = 16;
constexpr std::size_t kMinSlab = 64 * kKiB;

// Buffer ids of host blocks: past any the driver hands out, so that a block's id never equals
// another allocation's. Taken only when a program asks for one.
std::atomic<std::uint64_t> g_next_buffer_id{std::uint64_t{1} << 62};

}  // namespace

bool HostBudget::take(std::size_t bytes) {
  if (limit_ == 0) {
    held_.fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }
  std::size_t held = held_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ || held > limit_ - bytes) return false;
  } while (!held_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
  return true;
}

std::optional<unsigned> HostCache::class_of(std::size_t bytes) {
  if (bytes == 0 || bytes > kMaxRequest) return std::nullopt;
  if (bytes <= kMiB) {
    const std::size_t size = std::max(kMinBlock, std::bit_ceil(bytes));
    return static_cast<unsigned>(std::countr_zero(size) - std::countr_zero(kMinBlock));
  }
  const unsigned e = static_cast<unsigned>(std::bit_width(bytes - 1)) - 1;  // 2^e < bytes <= 2^(e+1)
  const std::size_t step = std::size_t{1} << (e - 2);
  const std::size_t q = (bytes - (std::size_t{1} << e) + step - 1) / step;  // 1..4
  return kSmallClasses + (e - kFirstLargeExp) * 4 + static_cast<unsigned>(q - 1);
}

std::size_t HostCache::class_size(unsigned cls) {
  if (cls < kSmallClasses) return kMinBlock << cls;
  const unsigned k = cls - kSmallClasses;
  const unsigned e = kFirstLargeExp + k / 4;
  return (std::size_t{1} << e) + (k % 4 + 1) * (std::size_t{1} << (e - 2));
}

std::size_t HostCache::segment_size(std::size_t block_size) {
  if (block_size > kLargestSlabBlock) return block_size;
  return std::max(kMinSlab, block_size * kBlocksPerSlab);
}

HostCache::HostCache(HostBackend& backend, HostBudget& budget, int device)
    : backend_(backend), budget_(budget), device_(device) {}

HostCache::~HostCache() {
  for (auto& f : flagsets_) delete f.load(std::memory_order_relaxed);
}

HostCache::SizeClass* HostCache::existing_class(unsigned flags, unsigned cls) const {
  FlagSet* set = flagsets_[flags & kFlagMask].load(std::memory_order_acquire);
  return set == nullptr ? nullptr : &set->classes[cls];
}

HostCache::SizeClass& HostCache::size_class(unsigned flags, unsigned cls) {
  if (SizeClass* c = existing_class(flags, cls)) [[likely]] return *c;
  std::lock_guard lock(flagsets_mutex_);
  std::atomic<FlagSet*>& slot = flagsets_[flags & kFlagMask];
  if (slot.load(std::memory_order_acquire) == nullptr) {
    auto* set = new FlagSet;
    set->classes = std::vector<SizeClass>(kClasses);
    slot.store(set, std::memory_order_release);
  }
  used_.store(true, std::memory_order_relaxed);
  return slot.load(std::memory_order_acquire)->classes[cls];
}

void HostCache::notify(EventKind kind, const void* ptr, std::size_t requested, std::size_t rounded, bool hit,
                       Status result) const {
  AllocatorEvent e{};
  e.kind = kind;
  e.cache_hit = hit;
  e.result = result;
  e.device = -1;  // host memory belongs to no device
  e.stream = kNoStream;
  e.ptr = reinterpret_cast<DevicePtr>(ptr);
  e.requested = requested;
  e.rounded = rounded;
  // The trace's totals for host records: the cache's own reserved bytes; allocated is left to
  // readers, who sum host_alloc/host_free (a shared counter here would cost every hit).
  e.reserved_after = reserved_.load(std::memory_order_relaxed);
  observer_->on_event(e);
}

// The open batch's blocks wait behind one new fence.
void HostCache::close_batch_locked(SizeClass& c) {
  Batch batch;
  batch.blocks = std::move(c.open);
  c.open.clear();
  batch.fence = backend_.record_fence();
  ++c.fences;
  c.fenced.push_back(std::move(batch));
}

void HostCache::poll_locked(SizeClass& c) {
  std::size_t done = 0;
  while (done < c.fenced.size() && c.fenced[done].fence->done()) {
    for (Block* b : c.fenced[done].blocks) {
      b->state = Block::State::kReady;
      ++b->segment->ready;
      c.pending_bytes -= b->segment->block_size;
      c.ready.push_back(b);
    }
    ++done;
  }
  c.fenced.erase(c.fenced.begin(), c.fenced.begin() + static_cast<std::ptrdiff_t>(done));
}

HostCache::Block* HostCache::take_locked(SizeClass& c, bool* fenced) {
  if (c.ready.empty()) {
    if (c.fenced.empty() && c.open.empty()) return nullptr;
    poll_locked(c);
    if (c.ready.empty() && !c.open.empty()) {
      close_batch_locked(c);
      poll_locked(c);
    }
    if (c.ready.empty()) return nullptr;
    *fenced = true;
  }
  Block* b = c.ready.back();
  c.ready.pop_back();
  return b;
}

void HostCache::hand_out_locked(SizeClass& c, Block* b, std::size_t bytes) {
  b->state = Block::State::kLive;
  b->requested = bytes;
  b->buffer_id = 0;
  --b->segment->ready;
  c.in_use_bytes += b->segment->block_size;
  c.requested_bytes += bytes;
  ++c.in_use_blocks;
  ++c.allocations;
}

Status HostCache::new_segment(unsigned flags, unsigned cls, Segment** out) {
  const std::size_t block = class_size(cls);
  const std::size_t bytes = segment_size(block);
  void* base = nullptr;
  for (int attempt = 0;; ++attempt) {
    Status st = Status::kOutOfMemory;
    if (budget_.take(bytes)) {
      st = backend_.allocate(bytes, flags, &base);
      if (st == Status::kOk) break;
      budget_.give(bytes);
    }
    // Out of host memory or over the limit: give back what is idle (waiting for fences) and
    // try once more.
    const bool released = st == Status::kOutOfMemory && attempt == 0 &&
                          (reclaimer_ ? reclaimer_() : release_cached(true) != 0);
    if (!released) return st;
  }
  auto seg = std::make_unique<Segment>();
  seg->base = static_cast<char*>(base);
  seg->bytes = bytes;
  seg->block_size = block;
  seg->flags = flags;
  seg->cls = cls;
  seg->blocks.resize(bytes / block);
  seg->ready = seg->blocks.size();
  for (std::size_t i = 0; i < seg->blocks.size(); ++i) {
    seg->blocks[i].segment = seg.get();
    seg->blocks[i].ptr = seg->base + i * block;
  }
  Segment* raw = seg.get();
  {
    std::unique_lock lock(segments_mutex_);
    segments_.emplace(reinterpret_cast<std::uintptr_t>(base), std::move(seg));
    segment_count_.fetch_add(1, std::memory_order_release);
  }
  const std::size_t reserved = reserved_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = peak_reserved_.load(std::memory_order_relaxed);
  while (reserved > peak && !peak_reserved_.compare_exchange_weak(peak, reserved, std::memory_order_relaxed)) {
  }
  driver_allocs_.fetch_add(1, std::memory_order_relaxed);
  if (observer_ != nullptr) notify(EventKind::kHostSegmentAlloc, base, bytes, bytes, false);
  *out = raw;
  return Status::kOk;
}

Status HostCache::allocate(std::size_t bytes, unsigned flags, void** out, bool* hit) {
  const std::optional<unsigned> cls = class_of(bytes);
  if (!cls || (flags & ~kFlagMask) != 0 || out == nullptr) return Status::kInvalidValue;
  SizeClass& c = size_class(flags, *cls);
  {
    std::lock_guard lock(c.mutex);
    bool fenced = false;
    if (Block* b = take_locked(c, &fenced)) {
      hand_out_locked(c, b, bytes);
      ++c.hits;
      c.fenced_hits += fenced;
      if (observer_ != nullptr) notify(EventKind::kHostAlloc, b->ptr, bytes, b->segment->block_size, true);
      *out = b->ptr;
      if (hit != nullptr) *hit = true;
      return Status::kOk;
    }
  }
  Segment* seg = nullptr;
  const Status st = new_segment(flags, *cls, &seg);
  if (st != Status::kOk) {
    ooms_.fetch_add(1, std::memory_order_relaxed);
    if (observer_ != nullptr) notify(EventKind::kHostAlloc, nullptr, bytes, class_size(*cls), false, st);
    return st;
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(c.mutex);
  // The first block is this request's; the others wait in the class, lowest address next.
  for (std::size_t i = seg->blocks.size(); i-- > 1;) c.ready.push_back(&seg->blocks[i]);
  Block* b = &seg->blocks[0];
  hand_out_locked(c, b, bytes);
  if (observer_ != nullptr) notify(EventKind::kHostAlloc, b->ptr, bytes, seg->block_size, false);
  *out = b->ptr;
  if (hit != nullptr) *hit = false;
  return Status::kOk;
}

namespace {
template <typename Map>
auto segment_at(Map& segments, const void* p) -> decltype(segments.begin()->second.get()) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  auto it = segments.upper_bound(addr);
  if (it == segments.begin()) return nullptr;
  --it;
  auto* seg = it->second.get();
  return addr < it->first + seg->bytes ? seg : nullptr;
}
}  // namespace

bool HostCache::owns(const void* p) const {
  if (segment_count_.load(std::memory_order_acquire) == 0) return false;
  std::shared_lock lock(segments_mutex_);
  return segment_at(segments_, p) != nullptr;
}

HostCache::Lookup HostCache::free(void* p) {
  if (segment_count_.load(std::memory_order_acquire) == 0) return Lookup::kNotOwned;
  std::shared_lock index(segments_mutex_);
  Segment* seg = segment_at(segments_, p);
  if (seg == nullptr) return Lookup::kNotOwned;
  const std::size_t off = static_cast<std::size_t>(static_cast<char*>(p) - seg->base);
  if (off % seg->block_size != 0) return Lookup::kFreed;  // inside a block
  Block* b = &seg->blocks[off / seg->block_size];
  SizeClass& c = *existing_class(seg->flags, seg->cls);
  std::lock_guard lock(c.mutex);
  if (b->state != Block::State::kLive) return Lookup::kFreed;
  b->state = Block::State::kPending;
  c.open.push_back(b);
  c.pending_bytes += seg->block_size;
  c.in_use_bytes -= seg->block_size;
  c.requested_bytes -= b->requested;
  --c.in_use_blocks;
  ++c.frees;
  if (observer_ != nullptr) notify(EventKind::kHostFree, p, b->requested, seg->block_size, false);
  return Lookup::kLive;
}

HostCache::Lookup HostCache::find(const void* p, HostBlockInfo* info) {
  if (segment_count_.load(std::memory_order_acquire) == 0) return Lookup::kNotOwned;
  std::shared_lock index(segments_mutex_);
  Segment* seg = segment_at(segments_, p);
  if (seg == nullptr) return Lookup::kNotOwned;
  const std::size_t off = static_cast<std::size_t>(static_cast<const char*>(p) - seg->base);
  Block* b = &seg->blocks[off / seg->block_size];
  SizeClass& c = *existing_class(seg->flags, seg->cls);
  std::lock_guard lock(c.mutex);
  if (b->state != Block::State::kLive) return Lookup::kFreed;
  if (b->buffer_id == 0) b->buffer_id = g_next_buffer_id.fetch_add(1, std::memory_order_relaxed);
  if (info != nullptr) {
    info->base = b->ptr;
    info->size = seg->block_size;
    info->requested = b->requested;
    info->flags = seg->flags;
    info->segment_base = seg->base;
    info->segment_size = seg->bytes;
    info->buffer_id = b->buffer_id;
  }
  return Lookup::kLive;
}

std::size_t HostCache::release_cached(bool wait) {
  if (segment_count_.load(std::memory_order_acquire) == 0) return 0;
  std::unique_lock index(segments_mutex_);
  return release_locked(wait);
}

std::size_t HostCache::release_locked(bool wait) {
  std::vector<Segment*> idle;
  for (auto& slot : flagsets_) {
    FlagSet* set = slot.load(std::memory_order_acquire);
    if (set == nullptr) continue;
    for (SizeClass& c : set->classes) {
      std::lock_guard lock(c.mutex);
      if (wait && !c.open.empty()) close_batch_locked(c);
      if (wait) {
        for (Batch& batch : c.fenced) {
          if (!batch.fence->wait()) break;  // a capture is on: those stay pending
        }
      }
      poll_locked(c);
      std::set<Segment*> whole;
      for (Block* b : c.ready) {
        if (b->segment->ready == b->segment->blocks.size()) whole.insert(b->segment);
      }
      if (whole.empty()) continue;
      std::erase_if(c.ready, [&](Block* b) { return whole.count(b->segment) != 0; });
      idle.insert(idle.end(), whole.begin(), whole.end());
    }
  }
  std::size_t released = 0;
  for (Segment* seg : idle) {
    if (backend_.free(seg->base) != Status::kOk) {
      // Still pinned and still ours: its blocks serve again.
      SizeClass& c = *existing_class(seg->flags, seg->cls);
      std::lock_guard lock(c.mutex);
      for (Block& b : seg->blocks) c.ready.push_back(&b);
      continue;
    }
    released += seg->bytes;
    budget_.give(seg->bytes);
    reserved_.fetch_sub(seg->bytes, std::memory_order_relaxed);
    driver_frees_.fetch_add(1, std::memory_order_relaxed);
    if (observer_ != nullptr) notify(EventKind::kHostSegmentFree, seg->base, seg->bytes, seg->bytes, false);
    segments_.erase(reinterpret_cast<std::uintptr_t>(seg->base));
    segment_count_.fetch_sub(1, std::memory_order_release);
  }
  return released;
}

void HostCache::forget_all() {
  std::unique_lock index(segments_mutex_);
  for (auto& slot : flagsets_) {
    FlagSet* set = slot.load(std::memory_order_acquire);
    if (set == nullptr) continue;
    for (SizeClass& c : set->classes) {
      std::lock_guard lock(c.mutex);
      c.ready.clear();
      c.open.clear();
      c.fenced.clear();
      c.in_use_bytes = c.requested_bytes = c.pending_bytes = 0;
      c.in_use_blocks = 0;
    }
  }
  // The records say what went, as for a device context's end: each live block, then its segment.
  for (auto& [base, seg] : segments_) {
    if (observer_ != nullptr) {
      for (const Block& b : seg->blocks) {
        if (b.state == Block::State::kLive) notify(EventKind::kHostFree, b.ptr, b.requested, seg->block_size, false);
      }
    }
    budget_.give(seg->bytes);
    reserved_.fetch_sub(seg->bytes, std::memory_order_relaxed);
    if (observer_ != nullptr) notify(EventKind::kHostSegmentFree, seg->base, seg->bytes, seg->bytes, false);
  }
  segments_.clear();
  segment_count_.store(0, std::memory_order_release);
}

HostCacheStats HostCache::stats() const {
  HostCacheStats s;
  for (const auto& slot : flagsets_) {
    FlagSet* set = slot.load(std::memory_order_acquire);
    if (set == nullptr) continue;
    for (SizeClass& c : set->classes) {
      std::lock_guard lock(c.mutex);
      s.in_use_bytes += c.in_use_bytes;
      s.requested_bytes += c.requested_bytes;
      s.pending_bytes += c.pending_bytes;
      s.in_use_blocks += c.in_use_blocks;
      s.allocations += c.allocations;
      s.hits += c.hits;
      s.fenced_hits += c.fenced_hits;
      s.frees += c.frees;
      s.fences += c.fences;
    }
  }
  s.reserved_bytes = reserved_.load(std::memory_order_relaxed);
  s.peak_reserved_bytes = peak_reserved_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.driver_allocs = driver_allocs_.load(std::memory_order_relaxed);
  s.driver_frees = driver_frees_.load(std::memory_order_relaxed);
  s.ooms = ooms_.load(std::memory_order_relaxed);
  return s;
}

std::string HostCache::summary() const {
  const HostCacheStats s = stats();
  auto n = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  SummarySection out;
  out.row("pinned host memory (cudaHostAlloc, cudaMallocHost), context of device %d", device_);
  const std::size_t cached = s.reserved_bytes > s.in_use_bytes ? s.reserved_bytes - s.in_use_bytes : 0;
  out.row("in use %s (%llu blocks, %s asked)  reserved %s  peak %s", format_bytes(s.in_use_bytes).c_str(),
          n(s.in_use_blocks), format_bytes(s.requested_bytes).c_str(), format_bytes(s.reserved_bytes).c_str(),
          format_bytes(s.peak_reserved_bytes).c_str());
  out.row("cached %s (%s awaiting fences)  limit %s (all contexts)", format_bytes(cached).c_str(),
          format_bytes(s.pending_bytes).c_str(), budget_.limit() == 0 ? "none" : format_bytes(budget_.limit()).c_str());
  out.row("host allocs: %llu  hits: %llu (after a fence: %llu)  misses: %llu  frees: %llu", n(s.allocations),
          n(s.hits), n(s.fenced_hits), n(s.misses), n(s.frees));
  out.row("driver allocs: %llu  driver frees: %llu  fences: %llu  OOMs: %llu", n(s.driver_allocs),
          n(s.driver_frees), n(s.fences), n(s.ooms));
  return out.finish();
}

}  // namespace cudalloc
