#include <catch2/catch.hpp>

#include <random>
#include <unordered_map>
#include <vector>

#include "allocator/live_map.h"

using namespace cudalloc;

TEST_CASE("the live map matches a plain hash map under random inserts, lookups and removals") {
  LiveMap map;
  std::unordered_map<DevicePtr, Block*> model;
  std::vector<Block> blocks(4096);
  std::mt19937_64 rng(7);
  std::vector<DevicePtr> keys;
  for (int step = 0; step < 200000; ++step) {
    const unsigned op = rng() % 10;
    if (op < 5 || keys.empty()) {
      // Dense, 512-aligned addresses collide in probe runs; sparse ones span the space.
      DevicePtr p = (rng() % 2 ? 0x7f0000000000ull + (rng() % 20000) * 512 : (rng() | 1) << 9);
      if (model.count(p)) continue;
      Block* b = &blocks[rng() % blocks.size()];
      map.insert(p, b);
      model[p] = b;
      keys.push_back(p);
    } else if (op < 8) {
      const std::size_t i = rng() % keys.size();
      const DevicePtr p = keys[i];
      REQUIRE(map.take(p) == model.at(p));
      REQUIRE(map.take(p) == nullptr);  // a second removal finds nothing
      model.erase(p);
      keys[i] = keys.back();
      keys.pop_back();
    } else {
      const DevicePtr p = rng() % 3 == 0 || keys.empty() ? (rng() << 9) : keys[rng() % keys.size()];
      auto it = model.find(p);
      REQUIRE(map.get(p) == (it == model.end() ? nullptr : it->second));
    }
  }
  for (DevicePtr p : keys) REQUIRE(map.get(p) == model.at(p));
  map.clear();
  for (DevicePtr p : keys) REQUIRE(map.get(p) == nullptr);
}
