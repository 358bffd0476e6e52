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
  // Deletes the segment and its blocks.
  void remove(Segment* segment);
  // Deletes everything.
  void clear();

  Segment* containing(DevicePtr ptr) const;
  // The block of a segment that contains `ptr`, or null.
  static Block* block_containing(const Segment& segment, DevicePtr ptr);

  std::size_t count() const { return segments_.size(); }
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
