// CUDALLOC_STATS=1: a memory_summary-style table per context on stderr, at exit and when a
// context goes. The runtime decides when (runtime.cpp, hooks_context.cpp); this prints.
#pragma once

#include "driver/context_state.h"
#include "driver/vmm_cache.h"

namespace cudalloc::shim {

// The table of every live context; `contexts` null: passthrough mode, which has none.
void print_stats(const ContextRegistry* contexts);

// The section of each device whose program used its own virtual memory (cuMemCreate).
void print_vmm_stats(const VmmCache& vmm);

// The table of a context that goes (cuCtxDestroy, a primary context's reset or last release),
// printed before its state is dropped; the others print at exit.
void print_context_end_stats(const ContextState& s);

}  // namespace cudalloc::shim
