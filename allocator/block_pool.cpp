#include "allocator/block_pool.h"

#include <algorithm>

namespace cudalloc {

void BlockPool::insert(Block* block) {
  if (blocks_.insert(block).second) bytes_ += block->size;
}

void BlockPool::erase(Block* block) {
  if (blocks_.erase(block) != 0) bytes_ -= block->size;
}

Block* BlockPool::best_fit(StreamHandle stream, std::size_t size) const {
  Block key;
  key.stream = stream;
  key.size = size;
  key.ptr = 0;
  auto it = blocks_.lower_bound(&key);
  if (it == blocks_.end() || (*it)->stream != stream) return nullptr;
  return *it;
}

std::size_t BlockPool::largest() const {
  std::size_t largest = 0;
  for (const Block* b : blocks_) largest = std::max(largest, b->size);
  return largest;
}

}  // namespace cudalloc
