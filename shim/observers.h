// The one observer each allocator gets: the trace writer, the NVTX registration, both, or none.
#pragma once

#include "allocator/events.h"

namespace cudalloc::shim {

// Call after the runtime has started tracing and NVTX registration; null when neither is on.
AllocatorObserver* allocator_observer();

}  // namespace cudalloc::shim
