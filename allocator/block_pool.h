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
  std::set<Block*, BySizeThenAddress> blocks_;
  std::size_t bytes_ = 0;
};

}  // namespace cudalloc
