// The classes of the thread caches' bins (allocator/bin_classes.h).
#include <catch2/catch.hpp>

#include <map>
#include <utility>

#include "allocator/bin_classes.h"

using namespace cudalloc;
namespace bc = cudalloc::bin_classes;

TEST_CASE("bin classes grow with the size and span at most an eighth of their smallest size") {
  for (PoolKind pool : {PoolKind::kSmall, PoolKind::kLarge}) {
    const std::size_t from = pool == PoolKind::kSmall ? kMinBlockSize : kSmallSize + kMinBlockSize;
    const std::size_t to = pool == PoolKind::kSmall ? kSmallSize : 64 * kMiB;
    std::map<std::size_t, std::pair<std::size_t, std::size_t>> span;  // class: smallest, largest size
    std::size_t last = 0;
    for (std::size_t size = from; size <= to; size += kMinBlockSize) {
      const std::size_t c = bc::of(size, pool);
      REQUIRE(c >= last);
      last = c;
      auto [it, added] = span.emplace(c, std::make_pair(size, size));
      if (!added) it->second.second = size;
    }
    for (const auto& [c, range] : span) {
      INFO("class " << c << ": " << range.first << " to " << range.second);
      if (range.first < bc::kFirstSplit) {
        CHECK(range.first == range.second);  // one 512-byte size each
      } else {
        CHECK(range.second - range.first < range.first / 8);
      }
    }
  }
}

TEST_CASE("the small and the large pool never share a bin class") {
  CHECK(bc::of(kMinBlockSize, PoolKind::kSmall) == 0);
  CHECK(bc::of(kSmallSize, PoolKind::kSmall) == bc::kSmallClasses - 1);
  CHECK(bc::of(kSmallSize + kMinBlockSize, PoolKind::kLarge) == bc::kSmallClasses);
  CHECK(bc::of(bc::kMaxSize, PoolKind::kLarge) == bc::kClasses - 1);
  // Sizes past a pool's range stay in its last class; none reaches the other pool's.
  CHECK(bc::of(2 * kSmallSize, PoolKind::kSmall) == bc::kSmallClasses - 1);
  CHECK(bc::of(4 * bc::kMaxSize, PoolKind::kLarge) == bc::kClasses - 1);
  CHECK(bc::of(kMinBlockSize, PoolKind::kLarge) == bc::kSmallClasses);
  // The next class stays in the pool: past either pool's last there is none.
  CHECK(bc::next(bc::kSmallClasses - 2) == bc::kSmallClasses - 1);
  CHECK(bc::next(bc::kSmallClasses - 1) == bc::kClasses);
  CHECK(bc::next(bc::kSmallClasses) == bc::kSmallClasses + 1);
  CHECK(bc::next(bc::kClasses - 1) == bc::kClasses);
}

TEST_CASE("a request may take a block at most half again its size, and never a MiB more") {
  CHECK(bc::slack(kMinBlockSize) == kMinBlockSize / 2);
  CHECK(bc::slack(64 * 1024) == 32 * 1024);
  CHECK(bc::slack(kSmallSize) == kSmallSize / 2);
  CHECK(bc::slack(2 * kMiB) == kSmallSize);
  CHECK(bc::slack(200 * kMiB) == kSmallSize);
}
