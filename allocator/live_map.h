// Live blocks by address: the table, and the map of the blocks that no thread cache holds.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "allocator/block.h"
#include "allocator/spin_lock.h"

namespace cudalloc {

// An open-addressing table of live blocks by address (linear probing, backward-shift deletion):
// an insert or a removal allocates nothing until the table grows, which keeps malloc off the
// hot path. The newest entry waits in a slot of its own and enters the table only when the
// next one arrives: a block freed before the next allocation (a loop of pairs) costs neither a
// hashed insert nor a removal. Not synchronized: its owner locks it.
class LiveTable {
 public:
  CUDALLOC_INLINE void insert(DevicePtr ptr, Block* block) {
    if (newest_.key != 0) insert_table(newest_.key, newest_.value);
    newest_ = Slot{ptr, block};
  }

  // insert() without a call: false, with nothing done, when the newest slot is taken.
  CUDALLOC_INLINE bool insert_newest(DevicePtr ptr, Block* block) {
    if (newest_.key != 0) return false;
    newest_ = Slot{ptr, block};
    return true;
  }
  // take() of the newest entry only: null, with nothing done, when `ptr` is not that one.
  CUDALLOC_INLINE Block* take_newest(DevicePtr ptr) {
    if (newest_.key != ptr) return nullptr;
    Block* b = newest_.value;
    newest_ = Slot{};
    return b;
  }

  // Removes and returns the block that starts at `ptr`; null if none.
  CUDALLOC_INLINE Block* take(DevicePtr ptr) {
    if (newest_.key == ptr) [[likely]] {
      Block* b = newest_.value;
      newest_ = Slot{};
      return b;
    }
    const std::size_t i = find(ptr);
    if (i == kMissing) return nullptr;
    Block* b = slots_[i].value;
    erase_at(i);
    return b;
  }

  Block* get(DevicePtr ptr) const {
    if (newest_.key == ptr && ptr != 0) return newest_.value;
    const std::size_t i = find(ptr);
    return i == kMissing ? nullptr : slots_[i].value;
  }

  bool empty() const { return count_ == 0 && newest_.key == 0; }

  template <typename F>
  void for_each(F&& f) const {
    if (newest_.key != 0) f(newest_.key, newest_.value);
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].key != 0) f(slots_[i].key, slots_[i].value);
    }
  }

  void clear() {
    newest_ = Slot{};
    for (std::size_t i = 0; i < capacity_; ++i) slots_[i] = Slot{};
    count_ = 0;
  }

 private:
  struct Slot {
    DevicePtr key = 0;  // 0: empty (no block starts at address 0)
    Block* value = nullptr;
  };
  static constexpr std::size_t kMissing = ~std::size_t{0};

  void insert_table(DevicePtr ptr, Block* block) {
    if ((count_ + 1) * 4 > capacity_ * 3) grow();
    std::size_t i = slot(ptr);
    while (slots_[i].key != 0) i = (i + 1) & (capacity_ - 1);
    slots_[i] = Slot{ptr, block};
    ++count_;
  }

  static std::uint64_t mix(DevicePtr ptr) {
    std::uint64_t x = (ptr >> 9) * 0x9E3779B97F4A7C15ull;  // blocks are 512-byte aligned
    return x ^ (x >> 29);
  }
  std::size_t slot(DevicePtr ptr) const { return mix(ptr) & (capacity_ - 1); }

  std::size_t find(DevicePtr ptr) const {
    // Key 0 marks an empty slot: probing for it would "find" one, and take() would erase it.
    if (capacity_ == 0 || ptr == 0) return kMissing;
    for (std::size_t i = slot(ptr);; i = (i + 1) & (capacity_ - 1)) {
      if (slots_[i].key == ptr) return i;
      if (slots_[i].key == 0) return kMissing;
    }
  }

  [[gnu::noinline, gnu::cold]] void grow() {
    const std::size_t old_capacity = capacity_;
    std::unique_ptr<Slot[]> old = std::move(slots_);
    capacity_ = old_capacity == 0 ? 64 : old_capacity * 2;
    slots_ = std::make_unique<Slot[]>(capacity_);
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].key == 0) continue;
      std::size_t j = slot(old[i].key);
      while (slots_[j].key != 0) j = (j + 1) & (capacity_ - 1);
      slots_[j] = old[i];
    }
  }

  // Removes slot i and shifts later members of its probe run back, so no tombstones build up.
  void erase_at(std::size_t i) {
    const std::size_t mask = capacity_ - 1;
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (slots_[j].key == 0) break;
      const std::size_t home = slot(slots_[j].key);
      // Move j back into the hole at i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --count_;
  }

  Slot newest_;
  std::unique_ptr<Slot[]> slots_;
  std::size_t capacity_ = 0;  // a power of two
  std::size_t count_ = 0;     // in slots_, newest_ not included
};

// The live blocks that no thread cache holds (ThreadCache::live holds those a thread took from
// its cache), sharded so that threads freeing different blocks rarely meet.
class LiveMap {
 public:
  void insert(DevicePtr ptr, Block* block) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.lock);
    s.table.insert(ptr, block);
  }

  // Removes and returns the block that starts at `ptr`; null if none. Only one caller wins,
  // so a racing double free is refused once.
  Block* take(DevicePtr ptr) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.lock);
    return s.table.take(ptr);
  }

  Block* get(DevicePtr ptr) {
    Shard& s = shard(ptr);
    std::lock_guard lock(s.lock);
    return s.table.get(ptr);
  }

  void clear() {
    for (Shard& s : shards_) {
      std::lock_guard lock(s.lock);
      s.table.clear();
    }
  }

 private:
  struct alignas(64) Shard {
    SpinLock lock;
    LiveTable table;
  };
  static constexpr std::size_t kShards = 64;

  // The shard follows the 2 MiB region: a thread's blocks come from its stream's segments, so
  // its operations stay on a few shards instead of bouncing every shard's cache line between
  // cores. Slots within a shard hash the whole address.
  Shard& shard(DevicePtr ptr) { return shards_[((ptr >> 21) * 0x9E3779B97F4A7C15ull) >> 58]; }

  std::array<Shard, kShards> shards_;
};

}  // namespace cudalloc
