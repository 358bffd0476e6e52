// CUDALLOC_SANITIZER=nvtx: caching stays on under compute-sanitizer, and memcheck is told what
// the cache does through the NVTX memory API (domain "cudalloc"): every segment is a
// sub-allocator heap, every live block a region of its requested size. memcheck then reports
// accesses outside live blocks, which a plain cache hides inside its segments.
#pragma once

#include "allocator/events.h"

namespace cudalloc::shim {

// Makes the registering observer (once, at runtime init). NVTX itself is first called at the
// first segment, inside a driver call: the sanitizer wants CUDA initialized before NVTX.
void start_nvtx_registration();

// The observer; null unless nvtx mode is on.
AllocatorObserver* nvtx_observer();

// The fork child may not take a lock another thread held at the fork.
void nvtx_after_fork_child();

}  // namespace cudalloc::shim
