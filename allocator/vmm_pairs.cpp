#include "allocator/vmm_pairs.h"

#include <algorithm>

#include "allocator/memory_stats.h"

namespace cudalloc {

namespace {

bool aligned(VmAddress base, std::size_t alignment) { return alignment == 0 || base % alignment == 0; }

void erase_value(std::vector<VmAddress>& v, VmAddress a) {
  for (std::size_t i = v.size(); i-- > 0;) {
    if (v[i] == a) {
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}

}  // namespace

VmmPairs::VmmPairs(int device, FenceRecorder record_fence) : device_(device), record_fence_(std::move(record_fence)) {}

std::optional<VmAddress> VmmPairs::pair_at(VmAddress va) const {
  auto it = ranges_.upper_bound(va);
  if (it == ranges_.begin()) return std::nullopt;
  --it;
  if (va >= it->first + it->second.size || !it->second.paired) return std::nullopt;
  return it->first;
}

void VmmPairs::unlist(VmAddress base, Pair& p) {
  switch (p.list) {
    case List::kNone:
      break;
    case List::kRangeLent:
      erase_value(range_lent_, base);
      break;
    case List::kHandleLent:
      erase_value(handle_lent_, base);
      break;
    case List::kReady:
      erase_value(ready_[p.size], base);
      --stats_.ready_pairs;
      stats_.ready_bytes -= p.size;
      break;
    case List::kPending: {
      auto [first, last] = pending_.equal_range(p.epoch);
      for (auto it = first; it != last; ++it) {
        if (it->second == base) {
          pending_.erase(it);
          break;
        }
      }
      --pending_sizes_[p.size];
      --stats_.pending_pairs;
      stats_.pending_bytes -= p.size;
      break;
    }
  }
  p.list = List::kNone;
}

void VmmPairs::place(VmAddress base, Pair& p) {
  unlist(base, p);
  const bool range_held = ranges_.at(base).held;
  const bool handle_held = handles_.at(p.handle).held;
  if (p.mapped) return;  // the program's buffer
  if (!range_held && !handle_held) {
    if (clean(p)) {
      ready_[p.size].push_back(base);
      p.list = List::kReady;
      ++stats_.ready_pairs;
      stats_.ready_bytes += p.size;
    } else {
      pending_.emplace(p.epoch, base);
      ++pending_sizes_[p.size];
      p.list = List::kPending;
      ++stats_.pending_pairs;
      stats_.pending_bytes += p.size;
    }
    stats_.peak_cached_bytes = std::max(stats_.peak_cached_bytes, stats_.ready_bytes + stats_.pending_bytes);
  } else if (range_held && !handle_held) {
    range_lent_.push_back(base);
    p.list = List::kRangeLent;
  } else if (handle_held && !range_held) {
    handle_lent_.push_back(base);
    p.list = List::kHandleLent;
  }
}

void VmmPairs::detach(VmAddress base, std::vector<VmOp>& settle) {
  auto pit = pairs_.find(base);
  Pair& p = pit->second;
  Range& r = ranges_.at(base);
  Handle& h = handles_.at(p.handle);
  unlist(base, p);
  if (!p.mapped) settle.push_back(VmOp{VmOp::Kind::kUnmap, base, p.size, 0});
  if (!h.held) settle.push_back(VmOp{VmOp::Kind::kRelease, 0, 0, p.handle});
  if (!r.held) settle.push_back(VmOp{VmOp::Kind::kAddressFree, base, p.size, 0});
  // What the program still holds stays known; a handle that was a pair's may be mapped where
  // the cache does not look, so it is never one again.
  if (h.held) {
    h.pair = 0;
    h.shared = true;
  } else {
    handles_.erase(p.handle);
  }
  if (r.held) {
    r.paired = false;
  } else {
    ranges_.erase(base);
  }
  pairs_.erase(pit);
}

void VmmPairs::detach_overlapping(VmAddress va, std::size_t size, std::vector<VmOp>& settle) {
  std::vector<VmAddress> hit;
  auto it = ranges_.upper_bound(va);
  if (it != ranges_.begin()) --it;
  for (; it != ranges_.end() && it->first < va + size; ++it) {
    if (it->second.paired && it->first + it->second.size > va) hit.push_back(it->first);
  }
  for (VmAddress base : hit) {
    detach(base, settle);
    ++stats_.detached;
  }
}

void VmmPairs::close_epoch() {
  if (open_pairs_ == 0) return;
  fences_.emplace_back(open_epoch_, record_fence_());
  ++open_epoch_;
  open_pairs_ = 0;
  ++stats_.fences;
}

void VmmPairs::poll() {
  while (!fences_.empty() && (fences_.front().second == nullptr || fences_.front().second->done())) {
    done_epoch_ = fences_.front().first;
    fences_.pop_front();
  }
  while (!pending_.empty() && pending_.begin()->first <= done_epoch_) {
    const VmAddress base = pending_.begin()->second;
    place(base, pairs_.at(base));  // off the pending list, onto the ready one
  }
}

std::optional<VmAddress> VmmPairs::take_ready(std::size_t size, std::size_t alignment) {
  auto attempt = [&]() -> std::optional<VmAddress> {
    auto it = ready_.find(size);
    if (it == ready_.end()) return std::nullopt;
    std::vector<VmAddress>& v = it->second;
    for (std::size_t i = v.size(); i-- > 0;) {
      if (!aligned(v[i], alignment)) continue;
      const VmAddress base = v[i];
      unlist(base, pairs_.at(base));
      return base;
    }
    return std::nullopt;
  };
  if (auto base = attempt()) return base;
  auto waiting = pending_sizes_.find(size);
  if (waiting == pending_sizes_.end() || waiting->second == 0) return std::nullopt;
  poll();
  if (auto base = attempt()) return base;
  // Pairs of this size given back since the last fence: one fence for all of them.
  bool open = false;
  for (auto [it, last] = pending_.equal_range(open_epoch_); it != last && !open; ++it) {
    open = pairs_.at(it->second).size == size;
  }
  if (!open) return std::nullopt;
  close_epoch();
  poll();
  return attempt();
}

std::optional<VmAddress> VmmPairs::lend_range(std::size_t size, std::size_t alignment) {
  std::lock_guard lock(mutex_);
  // A pair whose handle the program took first (create before reserve).
  for (std::size_t i = handle_lent_.size(); i-- > 0;) {
    const VmAddress base = handle_lent_[i];
    Pair& p = pairs_.at(base);
    if (p.size != size || !aligned(base, alignment)) continue;
    if (!clean(p)) {
      if (p.epoch == open_epoch_) close_epoch();
      poll();
      if (!clean(p)) continue;
    }
    ranges_.at(base).held = true;
    place(base, p);
    ++stats_.reserve_hits;
    return base;
  }
  if (auto base = take_ready(size, alignment)) {
    ranges_.at(*base).held = true;
    place(*base, pairs_.at(*base));
    ++stats_.reserve_hits;
    return base;
  }
  ++stats_.reserve_misses;
  return std::nullopt;
}

void VmmPairs::note_reserved(VmAddress base, std::size_t size) {
  std::lock_guard lock(mutex_);
  ranges_.insert_or_assign(base, Range{size, true, false});
}

std::optional<VmHandle> VmmPairs::lend_handle(std::size_t size) {
  std::lock_guard lock(mutex_);
  // A pair whose range the program holds, mapped to nothing in its view: its own handle then
  // makes the program's next map a no-op. Once the device is done with the handle's old use.
  for (std::size_t i = range_lent_.size(); i-- > 0;) {
    const VmAddress base = range_lent_[i];
    Pair& p = pairs_.at(base);
    if (p.size != size) continue;
    if (!clean(p)) {
      if (p.epoch == open_epoch_) close_epoch();
      poll();
      if (!clean(p)) continue;
    }
    handles_.at(p.handle).held = true;
    place(base, p);
    ++stats_.create_hits;
    return p.handle;
  }
  if (auto base = take_ready(size, 0)) {
    Pair& p = pairs_.at(*base);
    handles_.at(p.handle).held = true;
    place(*base, p);
    ++stats_.create_hits;
    return p.handle;
  }
  ++stats_.create_misses;
  return std::nullopt;
}

void VmmPairs::note_created(VmHandle h, std::size_t size) {
  std::lock_guard lock(mutex_);
  handles_.insert_or_assign(h, Handle{size, true, false, 0});
}

VmDecision VmmPairs::map(VmAddress va, std::size_t size, std::size_t offset, VmHandle h) {
  std::lock_guard lock(mutex_);
  VmDecision d;
  if (auto base = pair_at(va)) {
    Pair& p = pairs_.at(*base);
    auto hit = handles_.find(h);
    if (va == *base && size == p.size && offset == 0 && h == p.handle && ranges_.at(*base).held &&
        hit->second.held && !p.mapped) {
      p.mapped = true;
      place(*base, p);
      ++stats_.calls_served;
      d.served = true;
      return d;
    }
  }
  detach_overlapping(va, size, d.settle);
  if (auto hit = handles_.find(h); hit != handles_.end() && hit->second.pair != 0) {
    detach(hit->second.pair, d.settle);
    ++stats_.detached;
  }
  return d;
}

void VmmPairs::note_mapped(VmAddress va, std::size_t size, std::size_t offset, VmHandle h) {
  std::lock_guard lock(mutex_);
  auto hit = handles_.find(h);
  if (hit == handles_.end()) return;
  Handle& hd = hit->second;
  auto rit = ranges_.find(va);
  const bool whole = rit != ranges_.end() && rit->second.held && !rit->second.paired && rit->second.size == size &&
                     offset == 0;
  if (whole && hd.held && !hd.shared && hd.pair == 0 && hd.size == size) {
    Pair p;
    p.handle = h;
    p.size = size;
    pairs_.emplace(va, std::move(p));
    rit->second.paired = true;
    hd.pair = va;
    ++stats_.adopted;
    return;
  }
  hd.shared = true;  // mapped where a pair would not know of it
}

VmDecision VmmPairs::unmap(VmAddress va, std::size_t size) {
  std::lock_guard lock(mutex_);
  VmDecision d;
  if (auto base = pair_at(va)) {
    Pair& p = pairs_.at(*base);
    if (va == *base && size == p.size && p.mapped && ranges_.at(*base).held) {
      p.mapped = false;
      p.epoch = open_epoch_;
      ++open_pairs_;
      place(*base, p);
      ++stats_.calls_served;
      d.served = true;
      return d;
    }
  }
  detach_overlapping(va, size, d.settle);
  return d;
}

VmDecision VmmPairs::set_access(VmAddress va, std::size_t size, std::span<const VmAccess> access) {
  std::lock_guard lock(mutex_);
  VmDecision d;
  if (access.empty()) return d;  // the driver's error
  if (auto base = pair_at(va)) {
    Pair& p = pairs_.at(*base);
    if (va == *base && size == p.size && p.mapped) {
      // Served when the driver already has every descriptor asked for.
      d.served = std::all_of(access.begin(), access.end(), [&](const VmAccess& a) {
        return std::find(p.access.begin(), p.access.end(), a) != p.access.end();
      });
      stats_.calls_served += d.served;
      return d;
    }
  }
  detach_overlapping(va, size, d.settle);
  return d;
}

void VmmPairs::note_access(VmAddress va, std::size_t size, std::span<const VmAccess> access) {
  std::lock_guard lock(mutex_);
  auto base = pair_at(va);
  if (!base || *base != va) return;
  Pair& p = pairs_.at(*base);
  if (size != p.size) return;
  for (const VmAccess& a : access) {
    auto same =
        std::find_if(p.access.begin(), p.access.end(), [&](const VmAccess& b) { return b.location == a.location; });
    if (same != p.access.end()) {
      same->flags = a.flags;
    } else {
      p.access.push_back(a);
    }
  }
}

VmDecision VmmPairs::release(VmHandle h) {
  std::lock_guard lock(mutex_);
  VmDecision d;
  auto hit = handles_.find(h);
  if (hit == handles_.end()) return d;
  if (hit->second.pair == 0) {
    handles_.erase(hit);
    return d;
  }
  const VmAddress base = hit->second.pair;
  if (!hit->second.held) {  // released twice: the driver answers, as it would have
    detach(base, d.settle);
    ++stats_.detached;
    return d;
  }
  hit->second.held = false;
  place(base, pairs_.at(base));
  ++stats_.calls_served;
  d.served = true;
  return d;
}

VmDecision VmmPairs::address_free(VmAddress va, std::size_t size) {
  std::lock_guard lock(mutex_);
  VmDecision d;
  auto rit = ranges_.find(va);
  if (rit == ranges_.end()) return d;
  if (rit->second.paired) {
    Pair& p = pairs_.at(va);
    if (size == p.size && rit->second.held && !p.mapped) {
      rit->second.held = false;
      place(va, p);
      ++stats_.calls_served;
      d.served = true;
      return d;
    }
    detach(va, d.settle);
    ++stats_.detached;
  }
  ranges_.erase(va);  // the driver's from now on, whatever it answers
  return d;
}

VmDecision VmmPairs::expose(VmAddress va) {
  std::lock_guard lock(mutex_);
  VmDecision d;
  if (auto base = pair_at(va)) {
    detach(*base, d.settle);
    ++stats_.detached;
  }
  return d;
}

VmDecision VmmPairs::expose_handle(VmHandle h) {
  std::lock_guard lock(mutex_);
  VmDecision d;
  auto hit = handles_.find(h);
  if (hit == handles_.end()) return d;
  if (hit->second.pair != 0) {
    detach(hit->second.pair, d.settle);
    ++stats_.detached;
  }
  // detach() keeps a handle the program holds, as shared; one it released is gone.
  if (auto again = handles_.find(h); again != handles_.end()) again->second.shared = true;
  return d;
}

std::vector<VmOp> VmmPairs::release_cached(std::size_t* bytes) {
  std::lock_guard lock(mutex_);
  poll();
  std::vector<VmAddress> cached;
  for (const auto& [size, v] : ready_) cached.insert(cached.end(), v.begin(), v.end());
  for (const auto& [epoch, base] : pending_) cached.push_back(base);
  std::vector<VmOp> ops;
  std::size_t total = 0;
  for (VmAddress base : cached) {
    total += pairs_.at(base).size;
    detach(base, ops);
    ++stats_.released;
  }
  if (bytes != nullptr) *bytes = total;
  return ops;
}

VmmStats& VmmStats::operator+=(const VmmStats& o) {
  create_hits += o.create_hits;
  create_misses += o.create_misses;
  reserve_hits += o.reserve_hits;
  reserve_misses += o.reserve_misses;
  calls_served += o.calls_served;
  adopted += o.adopted;
  detached += o.detached;
  released += o.released;
  fences += o.fences;
  ready_pairs += o.ready_pairs;
  ready_bytes += o.ready_bytes;
  pending_pairs += o.pending_pairs;
  pending_bytes += o.pending_bytes;
  program_pairs += o.program_pairs;
  peak_cached_bytes += o.peak_cached_bytes;
  return *this;
}

bool VmmPairs::used() const {
  std::lock_guard lock(mutex_);
  return stats_.create_hits + stats_.create_misses + stats_.reserve_hits + stats_.reserve_misses + stats_.adopted != 0;
}

VmmStats VmmPairs::stats() const {
  std::lock_guard lock(mutex_);
  VmmStats s = stats_;
  s.program_pairs = pairs_.size() - s.ready_pairs - s.pending_pairs;
  return s;
}

std::string VmmPairs::summary() const {
  const VmmStats s = stats();
  auto n = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  SummarySection out;
  out.row("virtual memory (cuMemCreate) of the program, device %d", device_);
  out.row("creates  hits: %llu  misses: %llu    reserves  hits: %llu  misses: %llu", n(s.create_hits),
          n(s.create_misses), n(s.reserve_hits), n(s.reserve_misses));
  out.row("pairs cached: %llu (%s)  pending fences: %llu (%s)  peak cached %s", n(s.ready_pairs + s.pending_pairs),
          format_bytes(s.ready_bytes + s.pending_bytes).c_str(), n(s.pending_pairs),
          format_bytes(s.pending_bytes).c_str(), format_bytes(s.peak_cached_bytes).c_str());
  out.row("held by the program: %llu  adopted: %llu  calls not made: %llu  fences: %llu", n(s.program_pairs),
          n(s.adopted), n(s.calls_served), n(s.fences));
  out.row("releases: %llu  detached: %llu", n(s.released), n(s.detached));
  return out.finish();
}

}  // namespace cudalloc
