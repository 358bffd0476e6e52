// Free blocks of one pool (small or large), ordered for best fit in O(log n). Used under the
// device lock only. (Tree nodes from a std::pmr pool cost more instructions than malloc's
// thread cache, so plain std::set stays.) Each node holds its block's
// key, so a descent reads tree nodes only: comparing through Block pointers touched one more
// scattered cache line per level, which is what a pool of many free blocks pays for.
// A block's stream, size and address must not change while it is in the pool.
#pragma once

#include <cstddef>
#include <set>

#include "allocator/block.h"

namespace cudalloc {

class BlockPool {
 public:
  void insert(Block* block);
  void erase(Block* block);
  bool contains(Block* block) const { return blocks_.count(key_of(block)) != 0; }

  // The smallest free block of `stream` with size >= `size` (lowest address among equals).
  Block* best_fit(StreamHandle stream, std::size_t size) const;
  // The same block, taken out of the pool if `accept(block)`, else null: one tree descent
  // where best_fit() and erase() make three (erase by key is an equal_range).
  template <typename Accept>
  Block* take_best_fit(StreamHandle stream, std::size_t size, Accept&& accept) {
    auto it = lower_bound(stream, size);
    if (it == blocks_.end() || it->stream != stream || !accept(it->block)) return nullptr;
    Block* b = it->block;
    blocks_.erase(it);
    bytes_ -= b->size;
    return b;
  }

  void clear() {
    blocks_.clear();
    bytes_ = 0;
  }

  std::size_t count() const { return blocks_.size(); }
  std::size_t bytes() const { return bytes_; }
  std::size_t largest() const;

  template <typename F>
  void for_each(F&& f) const {
    for (const Entry& e : blocks_) f(e.block);
  }

 private:
  // Ordered by stream, then size, then address.
  struct Entry {
    StreamHandle stream;
    std::size_t size;
    DevicePtr ptr;
    Block* block;  // not part of the key
    bool operator<(const Entry& o) const {
      if (stream != o.stream) return stream < o.stream;
      if (size != o.size) return size < o.size;
      return ptr < o.ptr;
    }
  };
  using Set = std::set<Entry>;
  static Entry key_of(Block* b) { return Entry{b->stream, b->size, b->ptr, b}; }
  Set::const_iterator lower_bound(StreamHandle stream, std::size_t size) const;
  Set blocks_;
  std::size_t bytes_ = 0;
};

}  // namespace cudalloc
