#include <catch2/catch.hpp>

#include <random>
#include <utility>
#include <vector>

#include "allocator/region_filter.h"

using namespace cudalloc;

TEST_CASE("the region filter holds every address of every range added, and few others") {
  RegionFilter filter;
  std::mt19937_64 rng(11);
  std::vector<std::pair<DevicePtr, std::size_t>> ranges;
  for (int i = 0; i < 40; ++i) {
    // Segment-like ranges: 2 MiB aligned bases, 2 MiB to 64 MiB long.
    const DevicePtr base = (0x7f0000000000ull + (rng() % (1u << 20)) * (2ull << 20));
    const std::size_t bytes = (1 + rng() % 32) * (2ull << 20);
    filter.add(base, bytes);
    ranges.emplace_back(base, bytes);
  }
  for (auto [base, bytes] : ranges) {
    for (std::size_t off = 0; off < bytes; off += 512 * 1024) REQUIRE(filter.may_hold(base + off));
    REQUIRE(filter.may_hold(base + bytes - 512));
  }
  // At most 40 * 32 of 65536 bits are set: a random far address is almost never held.
  int held = 0;
  for (int i = 0; i < 10000; ++i) held += filter.may_hold(0x100000000000ull + (rng() % (1ull << 40))) ? 1 : 0;
  CHECK(held < 400);
}

TEST_CASE("a range longer than the filter marks every region") {
  RegionFilter filter;
  CHECK_FALSE(filter.may_hold(0x123456789000ull));
  filter.add(0x7f0000000000ull, std::size_t{1} << 40);  // 512Ki regions of 2 MiB
  CHECK(filter.may_hold(0x123456789000ull));
  CHECK(filter.may_hold(0x7f0000000000ull + (std::size_t{1} << 39)));
}

TEST_CASE("an empty range marks nothing") {
  RegionFilter filter;
  filter.add(0x7f0000000000ull, 0);
  CHECK_FALSE(filter.may_hold(0x7f0000000000ull));
}
