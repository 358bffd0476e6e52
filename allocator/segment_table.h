// Every segment the allocator holds from the device, by address. Owns segments and blocks.
#pragma once

#include <cstddef>
#include <map>
#include <memory>

#include "allocator/block.h"

namespace cudalloc {

class SegmentTable {
 public:
  SegmentTable() = default;
  SegmentTable(const SegmentTable&) = delete;
  SegmentTable& operator=(const SegmentTable&) = delete;
  ~SegmentTable() { clear(); }

  // A new segment holding one free block that covers it.
  Segment* add(DevicePtr base, std::size_t size, PoolKind pool, StreamHandle stream);
  // A new expandable segment over reserved address space: one unmapped free block.
  Segment* add_expandable(DevicePtr base, std::size_t size, PoolKind pool, StreamHandle stream);
  // Records that `bytes` (negative: unmapped) of an expandable segment changed mapping.
  void note_mapped(Segment* segment, std::ptrdiff_t bytes);
  // Deletes the segment and its blocks.
  void remove(Segment* segment);
  // Deletes everything.
  void clear();

  Segment* containing(DevicePtr ptr) const;
  // The block of a segment that contains `ptr`, or null.
  static Block* block_containing(const Segment& segment, DevicePtr ptr);

  std::size_t count() const { return segments_.size(); }
  // Bytes held from the device (mapped bytes for expandable segments).
  std::size_t bytes() const { return bytes_; }

  template <typename F>
  void for_each(F&& f) const {
    for (const auto& [base, segment] : segments_) f(segment.get());
  }

 private:
  std::map<DevicePtr, std::unique_ptr<Segment>> segments_;
  std::size_t bytes_ = 0;
};

}  // namespace cudalloc
