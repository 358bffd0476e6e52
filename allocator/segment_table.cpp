#include "allocator/segment_table.h"

namespace cudalloc {
namespace {

void delete_blocks(Segment& segment) {
  for (Block* b = segment.first; b != nullptr;) {
    Block* next = b->next;
    delete b;
    b = next;
  }
  segment.first = nullptr;
}

}  // namespace

Segment* SegmentTable::add(DevicePtr base, std::size_t size, PoolKind pool, StreamHandle stream) {
  auto segment = std::make_unique<Segment>();
  segment->base = base;
  segment->size = size;
  segment->pool = pool;
  segment->stream = stream;
  auto* block = new Block;
  block->ptr = base;
  block->size = size;
  block->stream = stream;
  block->pool = pool;
  block->segment = segment.get();
  segment->first = block;
  Segment* raw = segment.get();
  segments_.emplace(base, std::move(segment));
  bytes_ += size;
  return raw;
}

Segment* SegmentTable::add_expandable(DevicePtr base, std::size_t size, PoolKind pool, StreamHandle stream) {
  Segment* s = add(base, size, pool, stream);
  bytes_ -= size;  // nothing is mapped yet
  s->expandable = true;
  s->first->mapped = false;
  return s;
}

void SegmentTable::note_mapped(Segment* segment, std::ptrdiff_t bytes) {
  segment->mapped_bytes = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(segment->mapped_bytes) + bytes);
  bytes_ = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(bytes_) + bytes);
}

void SegmentTable::remove(Segment* segment) {
  auto it = segments_.find(segment->base);
  if (it == segments_.end() || it->second.get() != segment) return;
  bytes_ -= segment->reserved();
  delete_blocks(*segment);
  segments_.erase(it);
}

void SegmentTable::clear() {
  for (auto& [base, segment] : segments_) delete_blocks(*segment);
  segments_.clear();
  bytes_ = 0;
}

Segment* SegmentTable::containing(DevicePtr ptr) const {
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return nullptr;
  --it;
  Segment* s = it->second.get();
  return ptr < s->base + s->size ? s : nullptr;
}

Block* SegmentTable::block_containing(const Segment& segment, DevicePtr ptr) {
  for (Block* b = segment.first; b != nullptr; b = b->next) {
    if (ptr >= b->ptr && ptr < b->ptr + b->size) return b;
  }
  return nullptr;
}

}  // namespace cudalloc
