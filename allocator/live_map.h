// Live blocks by address, sharded so that threads freeing different blocks rarely meet. Each
// shard is an open-addressing table (linear probing, backward-shift deletion): an insert or a
// removal allocates nothing, which keeps malloc off the hot path.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "allocator/block.h"
#include "allocator/spin_lock.h"

namespace cudalloc {

class LiveMap {
 public:
  void insert(DevicePtr ptr, Block* block) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.lock);
    if ((s.count + 1) * 4 > s.capacity * 3) s.grow();
    std::size_t i = slot(s, ptr);
    while (s.slots[i].key != 0) i = (i + 1) & (s.capacity - 1);
    s.slots[i] = Slot{ptr, block};
    ++s.count;
  }

  // Removes and returns the block that starts at `ptr`; null if none. Only one caller wins,
  // so a racing double free is refused once.
  Block* take(DevicePtr ptr) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.lock);
    const std::size_t i = find(s, ptr);
    if (i == kMissing) return nullptr;
    Block* b = s.slots[i].value;
    erase_at(s, i);
    return b;
  }

  Block* get(DevicePtr ptr) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.lock);
    const std::size_t i = find(s, ptr);
    return i == kMissing ? nullptr : s.slots[i].value;
  }

  void clear() {
    for (Shard& s : shards_) {
      std::lock_guard lock(s.lock);
      for (std::size_t i = 0; i < s.capacity; ++i) s.slots[i] = Slot{};
      s.count = 0;
    }
  }

 private:
  struct Slot {
    DevicePtr key = 0;  // 0: empty (no block starts at address 0)
    Block* value = nullptr;
  };
  struct alignas(64) Shard {
    SpinLock lock;
    std::unique_ptr<Slot[]> slots;
    std::size_t capacity = 0;  // a power of two
    std::size_t count = 0;

    void grow() {
      const std::size_t old_capacity = capacity;
      std::unique_ptr<Slot[]> old = std::move(slots);
      capacity = old_capacity == 0 ? 64 : old_capacity * 2;
      slots = std::make_unique<Slot[]>(capacity);
      for (std::size_t i = 0; i < old_capacity; ++i) {
        if (old[i].key == 0) continue;
        std::size_t j = slot(*this, old[i].key);
        while (slots[j].key != 0) j = (j + 1) & (capacity - 1);
        slots[j] = old[i];
      }
    }
  };
  static constexpr std::size_t kShards = 64;
  static constexpr std::size_t kMissing = ~std::size_t{0};

  static std::uint64_t mix(DevicePtr ptr) {
    std::uint64_t x = (ptr >> 9) * 0x9E3779B97F4A7C15ull;  // blocks are 512-byte aligned
    return x ^ (x >> 29);
  }
  // The shard follows the 2 MiB region: a thread's blocks come from its stream's segments, so
  // its operations stay on a few shards instead of bouncing every shard's cache line between
  // cores. Slots within a shard hash the whole address.
  Shard& shard(DevicePtr ptr) { return shards_[((ptr >> 21) * 0x9E3779B97F4A7C15ull) >> 58]; }
  static std::size_t slot(const Shard& s, DevicePtr ptr) { return mix(ptr) & (s.capacity - 1); }

  static std::size_t find(const Shard& s, DevicePtr ptr) {
    if (s.capacity == 0) return kMissing;
    for (std::size_t i = slot(s, ptr);; i = (i + 1) & (s.capacity - 1)) {
      if (s.slots[i].key == ptr) return i;
      if (s.slots[i].key == 0) return kMissing;
    }
  }

  // Removes slot i and shifts later members of its probe run back, so no tombstones build up.
  static void erase_at(Shard& s, std::size_t i) {
    const std::size_t mask = s.capacity - 1;
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (s.slots[j].key == 0) break;
      const std::size_t home = slot(s, s.slots[j].key);
      // Move j back into the hole at i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        s.slots[i] = s.slots[j];
        i = j;
      }
    }
    s.slots[i] = Slot{};
    --s.count;
  }

  std::array<Shard, kShards> shards_;
};

}  // namespace cudalloc
