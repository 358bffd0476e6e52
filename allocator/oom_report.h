// What an out-of-memory failure tells the user, in the spirit of PyTorch's "Tried to allocate"
// message plus the fragmentation figures that explain it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "allocator/types.h"

namespace cudalloc {

struct OomReport {
  int device = 0;
  StreamHandle stream = 0;
  std::size_t requested = 0;          // what the program asked for
  std::size_t rounded = 0;            // after size-class rounding; 0: too large to round
  std::size_t limit = 0;              // the memory limit in force
  std::size_t device_total = 0;
  std::size_t allocated = 0;          // bytes in live blocks
  std::size_t reserved = 0;           // bytes held from the device
  std::size_t largest_free_block = 0; // largest cached block, any stream
  std::size_t free_fragmented = 0;    // cached bytes that are free but could not serve the request
  std::size_t pending_free = 0;       // freed bytes still waiting on device work
  std::size_t held_elsewhere = 0;     // held under the same limit by other contexts of the device
  std::size_t freeing = 0;            // given back, but the device frees it later (backend.h, kDeferred)

  std::string message() const;
};

}  // namespace cudalloc
