// The allocator's policy knobs. config/ fills them from CUDALLOC_CONF; tests set them directly.
#pragma once

#include <array>
#include <cstddef>
#include <limits>

#include "allocator/types.h"

namespace cudalloc {

// roundup_power2_divisions is kept per power-of-two size interval, as PyTorch does:
// index 0 covers everything below 2 MiB, index i covers [2^i MiB, 2^(i+1) MiB), and the last
// index everything from 32 GiB up. A list key of K MiB therefore sets index log2(K).
inline constexpr std::size_t kRoundupIntervals = 16;

struct AllocatorOptions {
  // Blocks of at least this size are never split. Max means "no limit" (PyTorch's default).
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  // Fraction (0, 1) of the memory limit past which idle segments are released before new
  // ones are made. 0 disables.
  double garbage_collection_threshold = 0.0;
  // 0 or 1: plain 512-byte rounding in that interval.
  std::array<std::size_t, kRoundupIntervals> roundup_power2_divisions{};
  bool expandable_segments = false;
  // Expandable segments map one physical page per granule and a growth takes the free pages of
  // other blocks before new memory (expandable_segments.h). Needs expandable_segments.
  bool page_stitching = false;
  // The bytes of one physical allocation under page stitching, the unit pages move in: larger
  // pages cost fewer driver calls and leave more of a partly used page idle. 0: the device's
  // granularity.
  std::size_t stitch_page_bytes = 0;
  // Fraction of the device's total memory the process may reserve. 1 = all.
  double per_process_memory_fraction = 1.0;
  // Absolute cap on reserved bytes. 0 = none.
  std::size_t memory_limit_bytes = 0;
  // cudaFree'd memory is put behind one device fence per epoch. On a miss the epoch is closed
  // only once it holds this many bytes (or memory is short): until then new memory is cut, so
  // the fence's cost is shared by many frees. 0 closes it at every miss.
  std::size_t free_epoch_bytes = 64 * kMiB;
  // cudaFree'd bytes that may wait on fences before a miss waits for the oldest fence instead
  // of cutting new memory. It bounds how far a program that runs ahead of the GPU can grow the
  // cache (native cudaFree would block it at every free). 0 = no bound.
  std::size_t max_pending_bytes = 1024 * kMiB;
  // Per-thread caches of small-pool blocks in front of the shared pools (thread_cache.h). Off
  // only in tests that look at pool-level behaviour such as coalescing.
  bool thread_cache = true;
  // Pinned host memory the host caches of all contexts may hold together (in use and cached).
  // 0 = none.
  std::size_t pinned_memory_limit_bytes = 0;
};

}  // namespace cudalloc
