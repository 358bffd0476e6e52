#include <catch2/catch.hpp>

#include "allocator/size_classes.h"

using namespace cudalloc;

TEST_CASE("requests round to 512-byte multiples") {
  AllocatorOptions o;
  SizeClasses s(o);
  CHECK(s.round(1) == 512);
  CHECK(s.round(512) == 512);
  CHECK(s.round(513) == 1024);
  CHECK(s.round(1000000) == 1000448);
  CHECK(s.round(3 * kMiB + 1) == 3 * kMiB + 512);
}

TEST_CASE("pools and segment sizes follow PyTorch's classes") {
  CHECK(SizeClasses::pool_for(512) == PoolKind::kSmall);
  CHECK(SizeClasses::pool_for(kMiB) == PoolKind::kSmall);
  CHECK(SizeClasses::pool_for(kMiB + 512) == PoolKind::kLarge);
  CHECK(SizeClasses::segment_size(512) == 2 * kMiB);
  CHECK(SizeClasses::segment_size(kMiB) == 2 * kMiB);
  CHECK(SizeClasses::segment_size(kMiB + 512) == 20 * kMiB);
  CHECK(SizeClasses::segment_size(10 * kMiB - 512) == 20 * kMiB);
  CHECK(SizeClasses::segment_size(10 * kMiB) == 10 * kMiB);
  CHECK(SizeClasses::segment_size(11 * kMiB + 1) == 12 * kMiB);
}

TEST_CASE("split remainders: any 512 B in the small pool, over 1 MiB in the large pool") {
  AllocatorOptions o;
  SizeClasses s(o);
  CHECK(s.should_split(2 * kMiB, 2 * kMiB - 512, PoolKind::kSmall));
  CHECK_FALSE(s.should_split(1024, 1024, PoolKind::kSmall));
  CHECK_FALSE(s.should_split(20 * kMiB, 19 * kMiB, PoolKind::kLarge));  // 1 MiB left: not more
  CHECK(s.should_split(20 * kMiB, 19 * kMiB - 512, PoolKind::kLarge));
}

TEST_CASE("max_split_size: oversize blocks are not split and not used for small requests") {
  AllocatorOptions o;
  o.max_split_size = 64 * kMiB;
  SizeClasses s(o);
  CHECK(s.is_oversize(64 * kMiB));
  CHECK_FALSE(s.is_oversize(64 * kMiB - 512));
  CHECK_FALSE(s.should_split(200 * kMiB, 100 * kMiB, PoolKind::kLarge));
  CHECK(s.should_split(60 * kMiB, 30 * kMiB, PoolKind::kLarge));
  CHECK_FALSE(s.may_serve(100 * kMiB, 30 * kMiB));
  CHECK(s.may_serve(100 * kMiB, 90 * kMiB));
  CHECK_FALSE(s.may_serve(100 * kMiB + 20 * kMiB, 100 * kMiB));  // would waste a whole 20 MiB
  CHECK(s.may_serve(100 * kMiB + 20 * kMiB - 512, 100 * kMiB));
}

TEST_CASE("roundup_power2_divisions rounds to the next division between powers of two") {
  CHECK(roundup_power2_next_division(1200, 4) == 1280);
  CHECK(roundup_power2_next_division(1024, 4) == 1024);
  CHECK(roundup_power2_next_division(5 * kMiB, 2) == 6 * kMiB);
  CHECK(roundup_power2_next_division(5 * kMiB, 1) == 5 * kMiB);

  AllocatorOptions o;
  o.roundup_power2_divisions.fill(4);
  SizeClasses s(o);
  // Up to 512 * divisions bytes the plain 512-byte rounding applies.
  CHECK(s.round(1200) == 1536);
  CHECK(s.round(2000) == 2048);
  CHECK(s.round(2049) == 2560);
  CHECK(s.round(3 * kMiB + 1) == 3 * kMiB + 512 * kKiB);
  CHECK(s.round(9 * kMiB) == 10 * kMiB);
}

TEST_CASE("roundup_power2_divisions intervals are chosen by size") {
  AllocatorOptions o;
  o.roundup_power2_divisions[0] = 1;   // below 2 MiB
  o.roundup_power2_divisions[1] = 8;   // [2 MiB, 4 MiB)
  o.roundup_power2_divisions[15] = 2;  // 32 GiB and up
  SizeClasses s(o);
  CHECK(s.divisions_for(1000) == 1);
  CHECK(s.divisions_for(2 * kMiB - 1) == 1);
  CHECK(s.divisions_for(2 * kMiB) == 8);
  CHECK(s.divisions_for(4 * kMiB - 1) == 8);
  CHECK(s.divisions_for(64 * kGiB) == 2);
  CHECK(s.round(1500) == 1536);                       // no divisions: plain 512 rounding
  CHECK(s.round(2 * kMiB + 1) == 2 * kMiB + 256 * kKiB);  // 8 steps of 256 KiB
}

TEST_CASE("divisions too many to multiply by the block size do not round to the next power of two") {
  // kMinBlockSize * divisions wraps to 0 from 2^55 on; the config refuses such values, and the
  // rounding must not turn them into "round everything to the next power of two" either.
  const std::size_t plain = 3 * kMiB + 1;
  const std::size_t to_block = (plain + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
  for (std::size_t shift : {55u, 56u, 63u}) {
    AllocatorOptions o;
    o.roundup_power2_divisions.fill(std::size_t{1} << shift);
    SizeClasses s(o);
    INFO("divisions 2^" << shift);
    CHECK(s.round(plain) == to_block);
    CHECK(s.round(kMaxRoundable) >= kMaxRoundable);
  }
  // The largest divisions the config accepts still round by divisions where a step is a block.
  AllocatorOptions o;
  o.roundup_power2_divisions.fill(kMaxRoundupDivisions);
  SizeClasses s(o);
  CHECK(s.round(plain) == to_block);
}
