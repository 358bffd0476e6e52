// Size classes: how a request is rounded, which pool serves it, how large a segment is cut for
// it and when a block is split. The rules and constants are PyTorch's, so traces and settings
// carry over.
#pragma once

#include <bit>
#include <cstddef>

#include "allocator/memory_stats.h"
#include "allocator/options.h"

namespace cudalloc {

inline constexpr std::size_t kMinBlockSize = 512;         // every block is a multiple of this
inline constexpr std::size_t kSmallSize = 1 * kMiB;       // requests up to this use the small pool
inline constexpr std::size_t kSmallBuffer = 2 * kMiB;     // segment size of the small pool
inline constexpr std::size_t kLargeBuffer = 20 * kMiB;    // segment size for 1-10 MiB requests
inline constexpr std::size_t kMinLargeAlloc = 10 * kMiB;  // from here segments fit the request
inline constexpr std::size_t kRoundLarge = 2 * kMiB;      // ...rounded up to this
// The largest request that is rounded at all: past it every rounding rule would overflow, and
// no device holds that much. A larger one is out of memory at once, its rounded size reported
// as 0 ("cannot be rounded").
inline constexpr std::size_t kMaxRoundable = ~std::size_t{0} / 2;
// roundup_power2_divisions above this are refused (config.cpp): finer steps buy nothing, and
// kMinBlockSize * divisions must not overflow in round_slow.
inline constexpr std::size_t kMaxRoundupDivisions = std::size_t{1} << 20;

class SizeClasses {
 public:
  explicit SizeClasses(const AllocatorOptions& options) : options_(options) {}

  // The block size a request gets. Requires bytes > 0. Inline for small requests without
  // roundup_power2_divisions (a multiple of 512): every allocation rounds its size first.
  std::size_t round(std::size_t bytes) const {
    if (const std::size_t r = round_plain(bytes)) [[likely]] return r;
    return round_slow(bytes);
  }
  // round() where it needs no call (no roundup_power2_divisions for the request's size), else 0.
  std::size_t round_plain(std::size_t bytes) const {
    // Small requests, nearly all of them, look at interval 0 without computing it.
    const std::size_t divisions =
        bytes <= kSmallSize ? options_.roundup_power2_divisions[0] : divisions_for(bytes);
    if (divisions <= 1) [[likely]] {
      return bytes <= kMinBlockSize ? kMinBlockSize : (bytes + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
    }
    return 0;
  }
  static PoolKind pool_for(std::size_t rounded) {
    return rounded <= kSmallSize ? PoolKind::kSmall : PoolKind::kLarge;
  }
  // Size of a new segment cut for a rounded request.
  static std::size_t segment_size(std::size_t rounded);
  // Whether a free block of `block_size` serving `rounded` leaves a remainder worth keeping.
  // With expandable segments any 512-byte remainder is (PyTorch's rule there too).
  bool should_split(std::size_t block_size, std::size_t rounded, PoolKind pool) const;
  // Whether a free block may serve the request at all under max_split_size (always, with
  // expandable segments).
  bool may_serve(std::size_t block_size, std::size_t rounded) const;
  bool is_oversize(std::size_t block_size) const { return block_size >= options_.max_split_size; }

  // The divisions in force for a size (roundup_power2_divisions interval lookup). Interval 0
  // holds everything below 2 MiB; interval i holds [2^i MiB, 2^(i+1) MiB).
  std::size_t divisions_for(std::size_t bytes) const {
    constexpr int kFirst = 20;  // log2(1 MiB)
    const int log_size = std::bit_width(bytes) - 1;
    std::size_t index = log_size > kFirst ? static_cast<std::size_t>(log_size - kFirst) : 0;
    if (index >= kRoundupIntervals) index = kRoundupIntervals - 1;
    return options_.roundup_power2_divisions[index];
  }

 private:
  std::size_t round_slow(std::size_t bytes) const;
  const AllocatorOptions& options_;
};

// Rounds `bytes` up to the next of `divisions` equal steps between two powers of two.
std::size_t roundup_power2_next_division(std::size_t bytes, std::size_t divisions);

}  // namespace cudalloc
