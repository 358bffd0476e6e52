// Pool membership and coalescing of free blocks (see free_blocks.h).
#include "allocator/free_blocks.h"

#include "allocator/allocator_stats.h"

namespace cudalloc {

void FreeBlocks::insert(Block* b) {
  b->state = BlockState::kFree;
  if (!b->mapped) {
    unmapped_.insert(b);
    return;
  }
  if (b->is_split()) {
    add_stat(stats_.inactive_split, b->segment->pool, 1);
    add_stat(stats_.inactive_split_bytes, b->segment->pool, static_cast<std::int64_t>(b->size));
  }
  pool(b->segment->pool).insert(b);
}

void FreeBlocks::erase(Block* b) {
  if (!b->mapped) {
    unmapped_.erase(b);
    return;
  }
  pool(b->segment->pool).erase(b);
  left_pool(b);
}

void FreeBlocks::left_pool(const Block* b) {
  if (b->is_split()) {
    sub_stat(stats_.inactive_split, b->segment->pool, 1);
    sub_stat(stats_.inactive_split_bytes, b->segment->pool, static_cast<std::int64_t>(b->size));
  }
}

Block* FreeBlocks::find(StreamHandle stream, std::size_t rounded, PoolKind kind) {
  // Candidates come in increasing size, so when the smallest fitting block breaks the
  // max_split_size rules every larger one does too.
  Block* b = pool(kind).take_best_fit(
      stream, rounded, [&](const Block* c) { return sizes_.may_serve(c->size, rounded); });
  if (b != nullptr) left_pool(b);
  return b;
}

void FreeBlocks::make_reusable(Block* b) {
  b->state = BlockState::kFree;
  b->stream_uses.clear();
  if (clock_ != nullptr && b->mapped && b->segment->expandable) {
    b->freed_era = clock_->now();
    clock_->stamped();
  }
  if (Block* prev = b->prev; prev != nullptr && prev->state == BlockState::kFree && prev->mapped == b->mapped) {
    erase(prev);
    prev->freed_era = std::max(prev->freed_era, b->freed_era);
    prev->size += b->size;
    prev->next = b->next;
    if (b->next) b->next->prev = prev;
    delete b;
    b = prev;
  }
  if (Block* next = b->next; next != nullptr && next->state == BlockState::kFree && next->mapped == b->mapped) {
    erase(next);
    b->freed_era = std::max(b->freed_era, next->freed_era);
    b->size += next->size;
    b->next = next->next;
    if (next->next) next->next->prev = b;
    delete next;
  }
  insert(b);
  if (b->segment->idle()) b->segment->idle_since = tick_;
}

Block* FreeBlocks::split_at(Block* b, std::size_t offset) {
  auto* rest = new Block;
  rest->ptr = b->ptr + offset;
  rest->size = b->size - offset;
  rest->stream = b->stream;
  rest->segment = b->segment;
  rest->pool = b->pool;
  rest->mapped = b->mapped;
  rest->state = b->state;
  rest->freed_era = b->freed_era;
  rest->prev = b;
  rest->next = b->next;
  if (b->next) b->next->prev = rest;
  b->next = rest;
  b->size = offset;
  return rest;
}

}  // namespace cudalloc
