// Whether cudalloc sends every call straight to the driver: CUDALLOC_NO_CACHING=1, or a
// process under compute-sanitizer (memcheck only knows the driver's own allocations).
#pragma once

#include "config/config.h"

namespace cudalloc::shim {

// compute-sanitizer leaves NV_SANITIZER_* variables, and NVTX_INJECTION64_PATH naming its
// injection library, in the environment of the process it runs.
bool sanitizer_detected(char** envp);

// Passthrough for this configuration; `reason` names why (for the info log).
bool choose_passthrough(const Config& config, bool under_sanitizer, const char** reason);

}  // namespace cudalloc::shim
