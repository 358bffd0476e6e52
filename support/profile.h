// CUDALLOC_PROFILE=1: counts and times what cudalloc does inside a process, so that a slower
// program can be told apart from a slower allocator without a system profiler (the GPU
// machine has none). Off by default; when off a Scope costs one predictable branch.
// Printed to stderr at exit: per site, calls, total time and time per call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace cudalloc::shim::profile {

enum class Site : int {
  kMemAlloc,        // cuMemAlloc hook (cudaMalloc)
  kMemFree,         // cuMemFree hook (cudaFree)
  kMemAllocAsync,   // cuMemAllocAsync hooks
  kMemFreeAsync,    // cuMemFreeAsync hooks
  kSegmentAlloc,    // driver: cuMemAlloc of a new segment
  kSegmentFree,     // driver: cuMemFree of a segment
  kMap,             // driver: create + map + set access (expandable segments)
  kUnmap,           // driver: unmap + release
  kFenceRecord,     // driver: the events of one fence
  kFenceQuery,      // driver: cuEventQuery
  kFenceWait,       // driver: waiting for a fence (the host blocks)
  kRemap,           // driver: pages moved (unmap + map + set access, page stitching)
  kCount,
};

namespace detail {
extern std::atomic<int> g_enabled;  // -1 until CUDALLOC_PROFILE is read, then 0 or 1
bool read_enabled();
}  // namespace detail

inline bool enabled() {
  const int on = detail::g_enabled.load(std::memory_order_relaxed);
  if (on == 0) [[likely]] return false;
  return on > 0 || detail::read_enabled();
}
void add(Site site, std::int64_t ns);

// Times a hook when CUDALLOC_PROFILE is on. Off, it costs a load, a test and a store: every
// cached pair constructs two.
class Scope {
 public:
  explicit Scope(Site site) {
    if (enabled()) [[unlikely]] {
      site_ = site;
      start_ = std::chrono::steady_clock::now();
    }
  }
  ~Scope() {
    if (site_ != Site::kCount) [[unlikely]] {
      add(site_, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Site site_ = Site::kCount;  // kCount: not timing
  std::chrono::steady_clock::time_point start_;
};

}  // namespace cudalloc::shim::profile
