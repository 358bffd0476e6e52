#include <catch2/catch.hpp>

#include <vector>

#include "allocator/block_pool.h"

using namespace cudalloc;

namespace {
Block make(StreamHandle stream, std::size_t size, DevicePtr ptr) {
  Block b;
  b.stream = stream;
  b.size = size;
  b.ptr = ptr;
  return b;
}
}  // namespace

TEST_CASE("best fit picks the smallest large-enough block of the stream, lowest address first") {
  std::vector<Block> blocks = {make(1, 4096, 0x10000), make(1, 1024, 0x20000), make(1, 2048, 0x30000),
                               make(1, 2048, 0x08000), make(2, 1024, 0x40000)};
  BlockPool pool;
  for (auto& b : blocks) pool.insert(&b);
  CHECK(pool.count() == 5);
  CHECK(pool.bytes() == 4096 + 1024 + 2048 + 2048 + 1024);
  CHECK(pool.best_fit(1, 1500) == &blocks[3]);  // 2048 at the lower address
  CHECK(pool.best_fit(1, 1024) == &blocks[1]);
  CHECK(pool.best_fit(1, 4097) == nullptr);     // the stream-2 block is never offered
  CHECK(pool.best_fit(2, 512) == &blocks[4]);
  CHECK(pool.best_fit(3, 1) == nullptr);
  CHECK(pool.largest() == 4096);
  pool.erase(&blocks[3]);
  CHECK(pool.best_fit(1, 1500) == &blocks[2]);
  CHECK_FALSE(pool.contains(&blocks[3]));
  CHECK(pool.bytes() == 4096 + 1024 + 2048 + 1024);
  pool.erase(&blocks[3]);  // erasing twice changes nothing
  CHECK(pool.count() == 4);
}
