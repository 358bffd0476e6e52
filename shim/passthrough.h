// What cudalloc does with the program's allocations: cache them, send every call straight to
// the driver (CUDALLOC_NO_CACHING=1, or under compute-sanitizer: memcheck only knows the
// driver's own allocations), or cache them and describe the cache to the sanitizer through
// the NVTX memory API (CUDALLOC_SANITIZER=nvtx, see sanitizer_nvtx.h).
#pragma once

#include "config/config.h"

namespace cudalloc::shim {

enum class CacheMode { kCaching, kPassthrough, kNvtx };

struct SanitizerEnv {
  bool detected = false;        // compute-sanitizer runs this process
  bool nvtx_injection = false;  // NVTX_INJECTION64_PATH names a tool to receive NVTX calls
};

// compute-sanitizer leaves NV_SANITIZER_* variables, and NVTX_INJECTION64_PATH naming its
// injection library, in the environment of the process it runs.
SanitizerEnv sanitizer_env(char** envp);

// The mode for this configuration; `reason` says why (for the info log).
CacheMode choose_mode(const Config& config, const SanitizerEnv& env, const char** reason);

}  // namespace cudalloc::shim
