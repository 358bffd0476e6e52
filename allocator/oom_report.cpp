#include "allocator/oom_report.h"

#include "allocator/memory_stats.h"

namespace cudalloc {

std::string OomReport::message() const {
  const std::string how = rounded != 0 ? "rounded to " + format_bytes(rounded) : "more than any device can hold";
  std::string m = "CUDA out of memory. Tried to allocate " + format_bytes(requested) + " (" + how +
                  ") on device " + std::to_string(device) + ". Limit " +
                  format_bytes(limit) + " of " + format_bytes(device_total) + " total; " +
                  format_bytes(allocated) + " allocated by the program; " + format_bytes(reserved) +
                  " reserved by cudalloc; largest free block " + format_bytes(largest_free_block) + "; " +
                  format_bytes(free_fragmented) + " free but fragmented";
  if (pending_free != 0) m += "; " + format_bytes(pending_free) + " waiting for device work";
  if (held_elsewhere != 0) m += "; " + format_bytes(held_elsewhere) + " held by other contexts on the device";
  if (freeing != 0) m += "; " + format_bytes(freeing) + " given back but not yet freed by the device";
  m += ". If reserved memory is much larger than allocated, set max_split_size_mb or "
       "expandable_segments:true in CUDALLOC_CONF to reduce fragmentation.";
  return m;
}

}  // namespace cudalloc
