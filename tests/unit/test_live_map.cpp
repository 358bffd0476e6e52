#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <unordered_map>
#include <vector>

#include "allocator/live_map.h"

using namespace cudalloc;

namespace {

// What a live map or table should hold, the blocks its entries point at, and the random steps.
struct Model {
  Model(std::size_t nblocks, std::uint64_t seed) : blocks(nblocks), rng(seed) {}
  std::unordered_map<DevicePtr, Block*> entries;
  std::vector<Block> blocks;
  std::mt19937_64 rng;
  std::vector<DevicePtr> keys;

  Block* any_block() { return &blocks[rng() % blocks.size()]; }
  void add(DevicePtr p, Block* b) {
    entries[p] = b;
    keys.push_back(p);
  }
  void remove_at(std::size_t i) {
    entries.erase(keys[i]);
    keys[i] = keys.back();
    keys.pop_back();
  }
};

}  // namespace

TEST_CASE("the live map matches a plain hash map under random inserts, lookups and removals") {
  LiveMap map;
  Model m(4096, 7);
  for (int step = 0; step < 200000; ++step) {
    const unsigned op = m.rng() % 10;
    if (op < 5 || m.keys.empty()) {
      // Dense, 512-aligned addresses collide in probe runs; sparse ones span the space.
      DevicePtr p = (m.rng() % 2 ? 0x7f0000000000ull + (m.rng() % 20000) * 512 : (m.rng() | 1) << 9);
      if (m.entries.count(p)) continue;
      Block* b = m.any_block();
      map.insert(p, b);
      m.add(p, b);
    } else if (op < 8) {
      const std::size_t i = m.rng() % m.keys.size();
      const DevicePtr p = m.keys[i];
      REQUIRE(map.take(p) == m.entries.at(p));
      REQUIRE(map.take(p) == nullptr);  // a second removal finds nothing
      m.remove_at(i);
    } else {
      const DevicePtr p = m.rng() % 3 == 0 || m.keys.empty() ? (m.rng() << 9) : m.keys[m.rng() % m.keys.size()];
      auto it = m.entries.find(p);
      REQUIRE(map.get(p) == (it == m.entries.end() ? nullptr : it->second));
    }
  }
  for (DevicePtr p : m.keys) REQUIRE(map.get(p) == m.entries.at(p));
  map.clear();
  for (DevicePtr p : m.keys) REQUIRE(map.get(p) == nullptr);
}

TEST_CASE("a live table lists, finds and removes its newest entry like the others") {
  LiveTable table;
  Model m(64, 11);
  DevicePtr last = 0;
  auto check_all = [&] {
    std::unordered_map<DevicePtr, Block*> seen;
    table.for_each([&](DevicePtr p, Block* b) { REQUIRE(seen.emplace(p, b).second); });
    REQUIRE(seen == m.entries);
    REQUIRE(table.empty() == m.entries.empty());
  };
  for (int step = 0; step < 50000; ++step) {
    const unsigned op = m.rng() % 8;
    if (op < 3 || m.keys.empty()) {
      const DevicePtr p = 0x7f0000000000ull + (m.rng() % 4096) * 512;
      if (m.entries.count(p)) continue;
      Block* b = m.any_block();
      table.insert(p, b);
      m.add(p, b);
      last = p;
    } else if (op < 6) {
      // Half the removals take the newest entry, as a loop of pairs does.
      std::size_t i = m.rng() % m.keys.size();
      if (op == 3 && m.entries.count(last)) i = static_cast<std::size_t>(std::find(m.keys.begin(), m.keys.end(), last) - m.keys.begin());
      const DevicePtr p = m.keys[i];
      REQUIRE(table.get(p) == m.entries.at(p));
      REQUIRE(table.take(p) == m.entries.at(p));
      REQUIRE(table.take(p) == nullptr);
      REQUIRE(table.get(p) == nullptr);
      m.remove_at(i);
    } else {
      check_all();
    }
  }
  check_all();
  table.clear();
  m.entries.clear();
  check_all();
  for (DevicePtr p : m.keys) REQUIRE(table.get(p) == nullptr);
}

TEST_CASE("taking or getting address 0 finds nothing and leaves the table and the map intact") {
  // Address 0 marks an empty slot. A free of pointer 0 (DeviceAllocator::free(0) on a thread
  // with live cached blocks) used to "find" the first empty slot of its probe and erase it,
  // counting one entry less: the table then filled up without growing, and the next insert
  // or lookup probed forever.
  LiveTable table;
  Block blocks[200];
  std::vector<DevicePtr> keys;
  for (std::size_t i = 0; i < 3; ++i) {
    keys.push_back(0x7f0000000000ull + i * 512);
    table.insert(keys.back(), &blocks[i]);  // the last in the newest slot, the others hashed
  }
  for (int i = 0; i < 100; ++i) {
    CHECK(table.take(0) == nullptr);
    CHECK(table.get(0) == nullptr);
  }
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(table.take(keys[i]) == &blocks[i]);
  REQUIRE(table.empty());  // (not a hang below)
  // Filled past its first capacity, it grows, and finds every entry.
  keys.clear();
  for (std::size_t i = 0; i < 200; ++i) {
    keys.push_back(0x7f0000000000ull + i * 512);
    table.insert(keys.back(), &blocks[i]);
  }
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(table.get(keys[i]) == &blocks[i]);

  LiveMap map;
  // In the first 2 MiB, the shard that address 0 falls in: the first goes into its table.
  map.insert(0x200, &blocks[0]);
  map.insert(0x400, &blocks[1]);
  for (int i = 0; i < 100; ++i) CHECK(map.take(0) == nullptr);
  CHECK(map.take(0x200) == &blocks[0]);
  CHECK(map.take(0x400) == &blocks[1]);
  for (std::size_t i = 0; i < 200; ++i) map.insert(0x200 + i * 512, &blocks[i]);
  for (std::size_t i = 0; i < 200; ++i) CHECK(map.get(0x200 + i * 512) == &blocks[i]);
}
