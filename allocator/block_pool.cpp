#include "allocator/block_pool.h"

#include <algorithm>

namespace cudalloc {

void BlockPool::insert(Block* block) {
  if (blocks_.insert(key_of(block)).second) bytes_ += block->size;
}

void BlockPool::erase(Block* block) {
  // find() and erase(iterator): one descent (erase by key searches an equal_range).
  auto it = blocks_.find(key_of(block));
  if (it == blocks_.end()) return;
  blocks_.erase(it);
  bytes_ -= block->size;
}

BlockPool::Set::const_iterator BlockPool::lower_bound(StreamHandle stream, std::size_t size) const {
  return blocks_.lower_bound(Entry{stream, size, 0, nullptr});
}

Block* BlockPool::best_fit(StreamHandle stream, std::size_t size) const {
  auto it = lower_bound(stream, size);
  if (it == blocks_.end() || it->stream != stream) return nullptr;
  return it->block;
}

std::size_t BlockPool::largest() const {
  std::size_t largest = 0;
  for (const Entry& e : blocks_) largest = std::max(largest, e.size);
  return largest;
}

}  // namespace cudalloc
