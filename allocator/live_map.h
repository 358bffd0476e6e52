// Live blocks by address, sharded so that threads freeing different blocks rarely meet.
#pragma once

#include <array>
#include <cstddef>
#include <mutex>
#include <unordered_map>

#include "allocator/block.h"
#include "allocator/spin_lock.h"

namespace cudalloc {

class LiveMap {
 public:
  void insert(DevicePtr ptr, Block* block) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.lock);
    s.map.emplace(ptr, block);
  }
  // Removes and returns the block that starts at `ptr`; null if none. Only one caller wins,
  // so a racing double free is refused once.
  Block* take(DevicePtr ptr) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.lock);
    auto it = s.map.find(ptr);
    if (it == s.map.end()) return nullptr;
    Block* b = it->second;
    s.map.erase(it);
    return b;
  }
  Block* get(DevicePtr ptr) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.lock);
    auto it = s.map.find(ptr);
    return it == s.map.end() ? nullptr : it->second;
  }
  void clear() {
    for (Shard& s : shards_) {
      std::lock_guard lock(s.lock);
      s.map.clear();
    }
  }

 private:
  static constexpr std::size_t kShards = 64;
  struct alignas(64) Shard {
    SpinLock lock;
    std::unordered_map<DevicePtr, Block*> map;
  };
  Shard& shard(DevicePtr ptr) {
    // Blocks are 512-byte aligned: hash the granule number.
    return shards_[((ptr >> 9) * 0x9E3779B97F4A7C15ull) >> 58];
  }
  std::array<Shard, kShards> shards_;
};

}  // namespace cudalloc
