#include "allocator/sim_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace cudalloc {

class SimBackend::SimFence final : public Fence {
 public:
  SimFence(SimBackend& sim, std::vector<std::pair<StreamHandle, std::uint64_t>> targets, bool orders_reuse = false)
      : sim_(sim), targets_(std::move(targets)), orders_reuse_(orders_reuse) {}

  bool orders_reuse() const override { return orders_reuse_; }

  bool done() override {
    std::lock_guard lock(sim_.mutex_);
    if (sim_.fences_stall_) return false;
    for (auto [handle, target] : targets_) {
      if (sim_.stream(handle).completed < target) return false;
    }
    return true;
  }

  // The simulated device catches up with the fence.
  bool wait() override {
    std::lock_guard lock(sim_.mutex_);
    for (auto [handle, target] : targets_) sim_.run_locked(handle, target);
    return true;
  }

 private:
  SimBackend& sim_;
  std::vector<std::pair<StreamHandle, std::uint64_t>> targets_;
  bool orders_reuse_;
};

SimBackend::SimBackend(SimOptions options) : options_(options) { streams_[0]; }

SimBackend::~SimBackend() {
  if (!options_.host_memory) return;
  for (auto [base, bytes] : segments_) munmap(reinterpret_cast<void*>(base), bytes);
  for (auto [base, bytes] : reservations_) munmap(reinterpret_cast<void*>(base), bytes);
}

bool SimBackend::should_fail(SimOp op) {
  auto it = fail_countdown_.find(op);
  if (it == fail_countdown_.end()) return false;
  if (it->second == 0) {
    fail_countdown_.erase(it);
    return true;
  }
  --it->second;
  return false;
}

// Outside the lock: `f` may call into this backend.
void SimBackend::run_during(SimOp op) {
  std::function<void()> f;
  {
    std::lock_guard lock(mutex_);
    auto it = during_.find(op);
    if (it == during_.end()) return;
    f = std::move(it->second);
    during_.erase(it);
  }
  f();
}

SimBackend::Stream& SimBackend::stream(StreamHandle handle) { return streams_[handle]; }

DevicePtr SimBackend::take_address(std::size_t bytes, std::size_t alignment) {
  if (!options_.host_memory) {
    DevicePtr p = (next_fake_address_ + alignment - 1) / alignment * alignment;
    next_fake_address_ = p + bytes;
    return p;
  }
  // Over-map, then trim to the alignment the driver would give.
  const std::size_t span = bytes + alignment;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return 0;
  const auto start = reinterpret_cast<DevicePtr>(raw);
  const DevicePtr aligned = (start + alignment - 1) / alignment * alignment;
  if (aligned > start) munmap(raw, aligned - start);
  const DevicePtr end = start + span;
  if (end > aligned + bytes) munmap(reinterpret_cast<void*>(aligned + bytes), end - (aligned + bytes));
  return aligned;
}

void SimBackend::give_address(DevicePtr base, std::size_t bytes) {
  if (options_.host_memory) munmap(reinterpret_cast<void*>(base), bytes);
}

Status SimBackend::allocate_segment(std::size_t bytes, DevicePtr* out) {
  std::lock_guard lock(mutex_);
  *out = 0;
  if (bytes == 0) return Status::kInvalidValue;
  if (should_fail(SimOp::kAllocate) || bytes > options_.total_memory - std::min(used_, options_.total_memory) ) {
    return Status::kOutOfMemory;
  }
  const std::size_t page = 4096;
  const std::size_t mapped = (bytes + page - 1) / page * page;
  const DevicePtr p = take_address(mapped, bytes >= 2 * kMiB ? 2 * kMiB : page);
  if (p == 0) return Status::kOutOfMemory;
  segments_[p] = mapped;
  used_ += bytes;
  ++segment_calls_;
  *out = p;
  return Status::kOk;
}

Status SimBackend::free_segment(DevicePtr ptr, std::size_t bytes) {
  run_during(SimOp::kFree);
  std::lock_guard lock(mutex_);
  auto it = segments_.find(ptr);
  if (it == segments_.end()) return Status::kInvalidValue;
  if (should_fail(SimOp::kFree)) return Status::kBackendError;
  if (defer_frees_) {
    deferred_frees_.emplace_back(ptr, bytes);
    return Status::kDeferred;
  }
  give_address(ptr, it->second);
  segments_.erase(it);
  used_ -= bytes;
  ++free_calls_;
  return Status::kOk;
}

void SimBackend::set_defer_frees(bool defer) {
  std::lock_guard lock(mutex_);
  defer_frees_ = defer;
}

void SimBackend::finish_deferred_frees() {
  std::vector<std::pair<DevicePtr, std::size_t>> frees;
  {
    std::lock_guard lock(mutex_);
    defer_frees_ = false;
    frees.swap(deferred_frees_);
  }
  free_deferred(frees);
}

std::unique_ptr<Fence> SimBackend::record_fence(StreamHandle handle) {
  std::lock_guard lock(mutex_);
  ++stream_fences_;
  return std::make_unique<SimFence>(*this, std::vector<std::pair<StreamHandle, std::uint64_t>>{
                                               {handle, stream(handle).enqueued}});
}

std::unique_ptr<Fence> SimBackend::record_device_fence() {
  run_during(SimOp::kDeviceFence);
  std::lock_guard lock(mutex_);
  ++device_fences_;
  std::vector<std::pair<StreamHandle, std::uint64_t>> targets;
  for (auto& [handle, s] : streams_) targets.emplace_back(handle, s.enqueued);
  return std::make_unique<SimFence>(*this, std::move(targets), options_.blocking_streams);
}

std::size_t SimBackend::total_memory() const {
  std::lock_guard lock(mutex_);
  return options_.total_memory;
}

Status SimBackend::reserve_address(std::size_t bytes, DevicePtr* out) {
  std::lock_guard lock(mutex_);
  *out = 0;
  const std::size_t g = options_.vm_granularity;
  if (bytes == 0 || bytes % g != 0) return Status::kInvalidValue;
  if (!options_.virtual_memory || should_fail(SimOp::kReserve)) return Status::kBackendError;
  DevicePtr p = 0;
  if (options_.host_memory) {
    const std::size_t span = bytes + g;
    void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return Status::kOutOfMemory;
    const auto start = reinterpret_cast<DevicePtr>(raw);
    p = (start + g - 1) / g * g;
    if (p > start) munmap(raw, p - start);
    if (start + span > p + bytes) munmap(reinterpret_cast<void*>(p + bytes), start + span - (p + bytes));
  } else {
    p = take_address(bytes, g);
  }
  reservations_[p] = bytes;
  *out = p;
  return Status::kOk;
}

Status SimBackend::free_address(DevicePtr base, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = reservations_.find(base);
  if (it == reservations_.end() || it->second != bytes) return Status::kInvalidValue;
  // Mapped pages inside must be unmapped first, as with the driver.
  auto m = mappings_.lower_bound(base);
  if (m != mappings_.end() && m->first < base + bytes) return Status::kInvalidValue;
  give_address(base, bytes);
  reservations_.erase(it);
  return Status::kOk;
}

bool SimBackend::free_address_range(DevicePtr va, std::size_t bytes) const {
  auto r = reservations_.upper_bound(va);
  if (r == reservations_.begin()) return false;
  --r;
  if (va + bytes > r->first + r->second) return false;
  auto next = mappings_.lower_bound(va);
  if (next != mappings_.end() && next->first < va + bytes) return false;
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > va) return false;
  }
  return true;
}

bool SimBackend::still_accessed(DevicePtr va, std::size_t bytes) const {
  return std::any_of(accesses_.begin(), accesses_.end(),
                     [&](const Access& a) { return a.ptr < va + bytes && va < a.ptr + a.bytes; });
}

Status SimBackend::map(DevicePtr va, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (!options_.virtual_memory) return Status::kBackendError;
  const std::size_t g = options_.vm_granularity;
  if (bytes == 0 || bytes % g != 0 || va % g != 0) return Status::kInvalidValue;
  if (!free_address_range(va, bytes)) return Status::kInvalidValue;
  if (should_fail(SimOp::kMap) || bytes > options_.total_memory - std::min(used_, options_.total_memory)) {
    return Status::kOutOfMemory;
  }
  if (options_.host_memory &&
      mprotect(reinterpret_cast<void*>(va), bytes, PROT_READ | PROT_WRITE) != 0) {
    return Status::kBackendError;
  }
  mappings_[va] = Mapping{bytes, next_physical_++};
  used_ += bytes;
  ++map_calls_;
  return Status::kOk;
}

Status SimBackend::map_pages(DevicePtr va, std::size_t bytes, std::size_t page) {
  std::lock_guard lock(mutex_);
  if (page == 0 || page % options_.vm_granularity != 0 || bytes % page != 0) return Status::kInvalidValue;
  const Status st = map(va, bytes);
  if (st != Status::kOk) return st;
  // One physical allocation per page, as the driver backend makes them.
  mappings_.erase(va);
  for (DevicePtr p = va; p < va + bytes; p += page) mappings_[p] = Mapping{page, next_physical_++};
  return Status::kOk;
}

bool SimBackend::can_remap() const {
  std::lock_guard lock(mutex_);
  return options_.virtual_memory && !capturing_;
}

Status SimBackend::remap(const std::vector<DevicePtr>& from, DevicePtr to, std::size_t page) {
  std::lock_guard lock(mutex_);
  const std::size_t g = page;
  if (!options_.virtual_memory || capturing_) return Status::kBackendError;
  if (page == 0 || page % options_.vm_granularity != 0) return Status::kInvalidValue;
  if (from.empty() || to % options_.vm_granularity != 0 || !free_address_range(to, from.size() * g)) {
    return Status::kInvalidValue;
  }
  for (DevicePtr p : from) {
    auto it = mappings_.find(p);
    if (it == mappings_.end() || it->second.bytes != g) return Status::kInvalidValue;
  }
  std::vector<DevicePtr> sorted(from);
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return Status::kInvalidValue;  // a page twice
  if (should_fail(SimOp::kRemap)) return Status::kBackendError;  // nothing moved
  for (std::size_t i = 0; i < from.size(); ++i) {
    const DevicePtr src = from[i];
    const DevicePtr dst = to + i * g;
    if (still_accessed(src, g)) ++unsafe_unmaps_;
    if (options_.host_memory) {
      // The contents go with the physical page, as on the device.
      mprotect(reinterpret_cast<void*>(dst), g, PROT_READ | PROT_WRITE);
      std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), g);
      madvise(reinterpret_cast<void*>(src), g, MADV_DONTNEED);
      mprotect(reinterpret_cast<void*>(src), g, PROT_NONE);
    }
    auto it = mappings_.find(src);
    const Mapping m = it->second;
    mappings_.erase(it);
    mappings_[dst] = m;
  }
  ++remap_calls_;
  remapped_pages_ += from.size();
  return Status::kOk;
}

Status SimBackend::unmap(DevicePtr va, std::size_t bytes) {
  run_during(SimOp::kUnmap);
  std::lock_guard lock(mutex_);
  // The range must be covered exactly by whole mappings.
  std::vector<std::map<DevicePtr, Mapping>::iterator> covered;
  DevicePtr at = va;
  auto it = mappings_.find(va);
  while (at < va + bytes) {
    if (it == mappings_.end() || it->first != at) return Status::kInvalidValue;
    covered.push_back(it);
    at += it->second.bytes;
    ++it;
  }
  if (at != va + bytes) return Status::kInvalidValue;
  if (should_fail(SimOp::kUnmap)) return Status::kBackendError;
  if (still_accessed(va, bytes)) ++unsafe_unmaps_;
  if (options_.host_memory) {
    madvise(reinterpret_cast<void*>(va), bytes, MADV_DONTNEED);
    mprotect(reinterpret_cast<void*>(va), bytes, PROT_NONE);
  }
  for (auto c : covered) mappings_.erase(c);
  used_ -= bytes;
  ++unmap_calls_;
  return Status::kOk;
}

void SimBackend::enqueue_access(StreamHandle handle, DevicePtr ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  Stream& s = stream(handle);
  const std::uint64_t seq = s.enqueued + 1;
  accesses_.push_back(Access{handle, seq, ptr, bytes});
  s.work.push_back([this, handle, seq, ptr, bytes] {
    if (!is_accessible(ptr, bytes)) ++bad_accesses_;
    std::erase_if(accesses_, [&](const Access& a) { return a.stream == handle && a.seq == seq; });
  });
  ++s.enqueued;
  watch_.note();
}

void SimBackend::set_capturing(bool capturing) {
  std::lock_guard lock(mutex_);
  capturing_ = capturing;
}

void SimBackend::enqueue(StreamHandle handle, std::function<void()> work) {
  std::lock_guard lock(mutex_);
  Stream& s = stream(handle);
  s.work.push_back(std::move(work));
  ++s.enqueued;
  watch_.note();
}

std::size_t SimBackend::run_locked(StreamHandle handle, std::uint64_t until) {
  std::size_t ran = 0;
  Stream& s = stream(handle);
  while (s.completed < until && !s.work.empty()) {
    auto work = std::move(s.work.front());
    s.work.pop_front();
    if (work) work();
    ++s.completed;
    ++ran;
  }
  return ran;
}

std::size_t SimBackend::run(StreamHandle handle, std::size_t max_items) {
  std::lock_guard lock(mutex_);
  Stream& s = stream(handle);
  const std::uint64_t until = max_items >= s.enqueued - s.completed ? s.enqueued : s.completed + max_items;
  return run_locked(handle, until);
}

void SimBackend::run_all() {
  std::lock_guard lock(mutex_);
  for (auto& [handle, s] : streams_) run_locked(handle, s.enqueued);
}

std::size_t SimBackend::queued(StreamHandle handle) const {
  std::lock_guard lock(mutex_);
  auto it = streams_.find(handle);
  return it == streams_.end() ? 0 : it->second.work.size();
}

void SimBackend::set_total_memory(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  options_.total_memory = bytes;
}

void SimBackend::fail_after(SimOp op, std::size_t calls_from_now) {
  std::lock_guard lock(mutex_);
  fail_countdown_[op] = calls_from_now;
}

void SimBackend::set_fences_stall(bool stall) {
  std::lock_guard lock(mutex_);
  fences_stall_ = stall;
}

void SimBackend::during_next(SimOp op, std::function<void()> f) {
  std::lock_guard lock(mutex_);
  during_[op] = std::move(f);
}

std::size_t SimBackend::used_bytes() const { std::lock_guard l(mutex_); return used_; }
std::size_t SimBackend::segment_calls() const { std::lock_guard l(mutex_); return segment_calls_; }
std::size_t SimBackend::free_calls() const { std::lock_guard l(mutex_); return free_calls_; }
std::size_t SimBackend::map_calls() const { std::lock_guard l(mutex_); return map_calls_; }
std::size_t SimBackend::unmap_calls() const { std::lock_guard l(mutex_); return unmap_calls_; }
std::size_t SimBackend::remap_calls() const { std::lock_guard l(mutex_); return remap_calls_; }
std::size_t SimBackend::remapped_pages() const { std::lock_guard l(mutex_); return remapped_pages_; }
std::size_t SimBackend::unsafe_unmaps() const { std::lock_guard l(mutex_); return unsafe_unmaps_; }
std::size_t SimBackend::bad_accesses() const { std::lock_guard l(mutex_); return bad_accesses_; }
std::uint64_t SimBackend::physical_at(DevicePtr va) const {
  std::lock_guard l(mutex_);
  auto it = mappings_.upper_bound(va);
  if (it == mappings_.begin()) return 0;
  --it;
  return va < it->first + it->second.bytes ? it->second.physical : 0;
}
std::size_t SimBackend::reserved_address_bytes() const {
  std::lock_guard l(mutex_);
  std::size_t bytes = 0;
  for (const auto& [base, size] : reservations_) bytes += size;
  return bytes;
}
std::size_t SimBackend::device_fences() const { std::lock_guard l(mutex_); return device_fences_; }
std::size_t SimBackend::stream_fences() const { std::lock_guard l(mutex_); return stream_fences_; }

bool SimBackend::is_accessible(DevicePtr ptr, std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  auto it = segments_.upper_bound(ptr);
  if (it != segments_.begin() && ptr + bytes <= std::prev(it)->first + std::prev(it)->second) return true;
  // Mapped memory may be several mappings side by side.
  auto m = mappings_.upper_bound(ptr);
  if (m == mappings_.begin()) return false;
  --m;
  DevicePtr end = m->first;
  while (m != mappings_.end() && m->first == end && end < ptr + bytes) {
    end += m->second.bytes;
    ++m;
  }
  return end >= ptr + bytes;
}

}  // namespace cudalloc
