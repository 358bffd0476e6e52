#include "allocator/size_classes.h"

#include <bit>

namespace cudalloc {
namespace {

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

std::size_t roundup_power2_next_division(std::size_t bytes, std::size_t divisions) {
  if (divisions <= 1 || std::has_single_bit(bytes)) return bytes;
  const std::size_t floor = std::bit_floor(bytes);
  const std::size_t step = floor / divisions;
  if (step == 0) return floor << 1;
  return floor + round_up(bytes - floor, step);
}

std::size_t SizeClasses::round_slow(std::size_t bytes) const {
  if (bytes <= kMinBlockSize) return kMinBlockSize;
  const std::size_t divisions = divisions_for(bytes);
  // bytes > kMinBlockSize * divisions, without the product (it wraps for divisions >= 2^55).
  if (divisions > 1 && divisions <= (bytes - 1) / kMinBlockSize) {
    return round_up(roundup_power2_next_division(bytes, divisions), kMinBlockSize);
  }
  return round_up(bytes, kMinBlockSize);
}

std::size_t SizeClasses::segment_size(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return round_up(rounded, kRoundLarge);
}

bool SizeClasses::should_split(std::size_t block_size, std::size_t rounded, PoolKind pool) const {
  const std::size_t remaining = block_size - rounded;
  // A remainder in a segment that grows in place is never stranded: keep any 512 bytes.
  if (pool == PoolKind::kSmall || options_.expandable_segments) return remaining >= kMinBlockSize;
  return rounded < options_.max_split_size && remaining > kSmallSize;
}

bool SizeClasses::may_serve(std::size_t block_size, std::size_t rounded) const {
  // Growing segments have no oversize blocks to protect: a free range at the growth point is
  // the place for any request. (With these rules it was never used, and growth never ended.)
  if (options_.expandable_segments) return true;
  // A request below the split limit never takes an unsplittable oversize block...
  if (rounded < options_.max_split_size && block_size >= options_.max_split_size) return false;
  // ...and an oversize request wastes at most one large buffer of it.
  if (rounded >= options_.max_split_size && block_size >= rounded + kLargeBuffer) return false;
  return true;
}

}  // namespace cudalloc
