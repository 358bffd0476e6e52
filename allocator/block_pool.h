// Free blocks of one pool (small or large), ordered for best fit in O(log n). Used under the
// device lock only. (Tree nodes from a std::pmr pool cost more instructions than malloc's
// thread cache: measured with callgrind, so plain std::set stays.)
#pragma once

#include <cstddef>
#include <set>

#include "allocator/block.h"

namespace cudalloc {

class BlockPool {
 public:
  void insert(Block* block);
  void erase(Block* block);
  bool contains(Block* block) const { return blocks_.count(block) != 0; }

  // The smallest free block of `stream` with size >= `size` (lowest address among equals).
  Block* best_fit(StreamHandle stream, std::size_t size) const;
  // The same block, taken out of the pool if `accept(block)`, else null: one tree descent
  // where best_fit() and erase() make three (erase by key is an equal_range).
  template <typename Accept>
  Block* take_best_fit(StreamHandle stream, std::size_t size, Accept&& accept) {
    auto it = lower_bound(stream, size);
    if (it == blocks_.end() || (*it)->stream != stream || !accept(*it)) return nullptr;
    Block* b = *it;
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
    for (Block* b : blocks_) f(b);
  }

 private:
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->ptr < b->ptr;
    }
  };
  using Set = std::set<Block*, BySizeThenAddress>;
  Set::const_iterator lower_bound(StreamHandle stream, std::size_t size) const;
  Set blocks_;
  std::size_t bytes_ = 0;
};

}  // namespace cudalloc
