// The classes of a thread cache's bins: which bin a cached block waits in, and which bins a
// request looks in. Below 4 KiB a class is one 512-byte size; from it, eight classes split each
// power of two, so a class spans at most an eighth of its smallest size. A block waits in the
// class of its size; a request takes a block of its own class that is large enough, or one of
// the next kReach classes within slack(), so that a program whose sizes vary (a random mix,
// shapes that change step to step) finds blocks of nearby sizes where bins of exact sizes
// always missed.
// Small- and large-pool blocks have classes of their own: a bin never mixes the pools.
#pragma once

#include <bit>
#include <cstddef>

#include "allocator/size_classes.h"

namespace cudalloc::bin_classes {

inline constexpr int kSplitsLog2 = 3;       // eight classes a power of two from 4 KiB
inline constexpr int kFirstSplitLog2 = 12;  // log2(4 KiB)
inline constexpr std::size_t kFirstSplit = std::size_t{1} << kFirstSplitLog2;
inline constexpr std::size_t kExactClasses = kFirstSplit / kMinBlockSize - 1;  // 512 B .. 3.5 KiB

// The class of a size on the one scale both pools share (a size below 512 B counts as 512 B).
// Monotone: a larger size never has a smaller class.
constexpr std::size_t scale_class(std::size_t size) {
  if (size <= kFirstSplit) return size <= kMinBlockSize ? 0 : (size - 1) / kMinBlockSize;
  const int log = std::bit_width(size) - 1;
  const std::size_t sub = (size >> (log - kSplitsLog2)) & ((std::size_t{1} << kSplitsLog2) - 1);
  return kExactClasses + (static_cast<std::size_t>(log - kFirstSplitLog2) << kSplitsLog2) + sub;
}

// Small-pool classes: 512 B up to kSmallSize, which is the last one's smallest size.
inline constexpr std::size_t kSmallClasses = scale_class(kSmallSize) + 1;
// Large-pool classes: past kSmallSize up to kMaxSize.
inline constexpr std::size_t kMaxSize = 512 * kMiB - 1;
inline constexpr std::size_t kLargeClasses = scale_class(kMaxSize) - scale_class(kSmallSize) + 1;
inline constexpr std::size_t kClasses = kSmallClasses + kLargeClasses;

// The bin of a block of `size` bytes from `pool` (sizes past kMaxSize share the last class).
constexpr std::size_t of(std::size_t size, PoolKind pool) {
  if (pool == PoolKind::kSmall) return size >= kSmallSize ? kSmallClasses - 1 : scale_class(size);
  const std::size_t c = scale_class(size < kSmallSize ? kSmallSize : size > kMaxSize ? kMaxSize : size);
  return kSmallClasses + c - scale_class(kSmallSize);
}

// The next class of the same pool, where every block is larger than any of `c`'s; kClasses
// past the pool's last.
constexpr std::size_t next(std::size_t c) {
  return c + 1 == kSmallClasses || c + 1 == kClasses ? kClasses : c + 1;
}

// A request looks this many classes past its own for a block, within slack().
inline constexpr std::size_t kReach = 4;

// How much larger than a rounded request a block from the bins may be: half of it (kReach
// classes' width), and never more than the large pool leaves unsplit (kSmallSize). The pools
// split blocks to fit; a thread's bins cannot without the device lock, and in a random mix of
// sizes a request finds a cached block within one class far less often than within four.
constexpr std::size_t slack(std::size_t rounded) {
  const std::size_t most = (rounded >> kSplitsLog2) * kReach;
  return most < kSmallSize ? most : kSmallSize;
}

// The largest block that may serve the rounded request.
constexpr std::size_t largest_for(std::size_t rounded) { return rounded + slack(rounded); }

}  // namespace cudalloc::bin_classes
