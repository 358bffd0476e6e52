#include <catch2/catch.hpp>

#include <algorithm>
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

TEST_CASE("a live table lists, finds and removes its newest entry like the others") {
  LiveTable table;
  std::unordered_map<DevicePtr, Block*> model;
  std::vector<Block> blocks(64);
  std::mt19937_64 rng(11);
  std::vector<DevicePtr> keys;
  DevicePtr last = 0;
  auto check_all = [&] {
    std::unordered_map<DevicePtr, Block*> seen;
    table.for_each([&](DevicePtr p, Block* b) { REQUIRE(seen.emplace(p, b).second); });
    REQUIRE(seen == model);
    REQUIRE(table.empty() == model.empty());
  };
  for (int step = 0; step < 50000; ++step) {
    const unsigned op = rng() % 8;
    if (op < 3 || keys.empty()) {
      const DevicePtr p = 0x7f0000000000ull + (rng() % 4096) * 512;
      if (model.count(p)) continue;
      Block* b = &blocks[rng() % blocks.size()];
      table.insert(p, b);
      model[p] = b;
      keys.push_back(p);
      last = p;
    } else if (op < 6) {
      // Half the removals take the newest entry, as a loop of pairs does.
      std::size_t i = rng() % keys.size();
      if (op == 3 && model.count(last)) i = static_cast<std::size_t>(std::find(keys.begin(), keys.end(), last) - keys.begin());
      const DevicePtr p = keys[i];
      REQUIRE(table.get(p) == model.at(p));
      REQUIRE(table.take(p) == model.at(p));
      REQUIRE(table.take(p) == nullptr);
      REQUIRE(table.get(p) == nullptr);
      model.erase(p);
      keys[i] = keys.back();
      keys.pop_back();
    } else {
      check_all();
    }
  }
  check_all();
  table.clear();
  model.clear();
  check_all();
  for (DevicePtr p : keys) REQUIRE(table.get(p) == nullptr);
}
