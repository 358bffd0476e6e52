// Allocator statistics, named as PyTorch's torch.cuda.memory_stats() names them.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace cudalloc {

// current / peak / cumulative allocated / cumulative freed, as PyTorch's Stat.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_peak() { peak = current; }
};

enum class PoolKind : std::uint8_t { kSmall, kLarge };

// Index into StatArray: all, small_pool, large_pool.
inline constexpr std::size_t kStatAll = 0;
inline constexpr std::size_t kStatTypes = 3;
inline std::size_t stat_index(PoolKind p) { return p == PoolKind::kSmall ? 1 : 2; }

using StatArray = std::array<Stat, kStatTypes>;

struct MemoryStats {
  StatArray allocation;              // number of live blocks
  StatArray segment;                 // number of segments
  StatArray active;                  // blocks allocated or waiting on a fence
  StatArray inactive_split;          // free blocks inside segments that also hold other blocks
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_pending_waits = 0;  // fences a miss waited for (max_pending_mb)
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  std::int64_t num_cache_hits = 0;    // allocations served without a device call
  std::int64_t num_cache_misses = 0;  // allocations that made a segment
  // Allocations and frees that took the device lock: a thread cache missed, or (frees) the
  // block could not go back to one. Few in a steady loop; many mean the threads contend.
  std::int64_t num_locked_allocs = 0;
  std::int64_t num_locked_frees = 0;
  // Of the locked allocations, those a thread took rather than wait for another thread's
  // fence of its next batch (the thread cache's bridge).
  std::int64_t num_bridged_allocs = 0;
  // Page stitching: growths served (partly) by moving free pages, and the pages moved.
  std::int64_t num_remaps = 0;
  std::int64_t num_remapped_pages = 0;
  std::int64_t num_remap_waits = 0;  // growths that waited for the device to free pages to move
  std::int64_t oversize_allocations = 0;
  std::int64_t oversize_segments = 0;
  // What the threads' caches hold out of the pools (blocks in their bins, and cudaFree'd blocks
  // waiting in their batches), read when the statistics are taken: how many threads have a
  // cache, their bytes together, and the most one thread holds.
  std::int64_t thread_caches = 0;
  std::int64_t thread_cache_bytes = 0;
  std::int64_t thread_cache_max_bytes = 0;

  // Keys as torch.cuda.memory_stats(): "allocated_bytes.all.current" and so on.
  std::map<std::string, std::int64_t> to_map() const;
  void reset_peaks();
  // What is held falls to zero (the arrays, the oversize counts); the counts of what happened
  // (the num_* fields) stay.
  void forget_held();
};

// A torch.cuda.memory_summary()-style table.
// `note`, if not empty, is one more line at the end of the table.
std::string format_memory_summary(const MemoryStats& stats, int device, std::size_t limit_bytes,
                                  std::string_view note = {});

// "1.50 GiB", "512 B"
std::string format_bytes(std::uint64_t bytes);

// A section printed under the summary table (pinned host memory, the program's virtual memory):
// framed rows of the table's width between two rules.
class SummarySection {
 public:
  SummarySection();
  // One row, printf-style; longer rows widen the frame rather than lose text.
  void row(const char* format, ...) __attribute__((format(printf, 2, 3)));
  // The section, closed with its rule.
  std::string finish();

 private:
  std::string out_;
};

}  // namespace cudalloc
