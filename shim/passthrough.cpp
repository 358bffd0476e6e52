#include "shim/passthrough.h"

#include <cstring>

namespace cudalloc::shim {

bool sanitizer_detected(char** envp) {
  if (envp == nullptr) return false;
  for (char** e = envp; *e != nullptr; ++e) {
    if (std::strncmp(*e, "NV_SANITIZER_", 13) == 0) return true;
    if (std::strncmp(*e, "NVTX_INJECTION64_PATH=", 22) == 0 && std::strstr(*e + 22, "sanitizer") != nullptr) {
      return true;
    }
  }
  return false;
}

bool choose_passthrough(const Config& config, bool under_sanitizer, const char** reason) {
  *reason = "";
  if (config.no_caching) {
    *reason = "CUDALLOC_NO_CACHING=1";
    return true;
  }
  if (!under_sanitizer) return false;
  switch (config.sanitizer) {
    case SanitizerMode::kOff:
      return false;
    case SanitizerMode::kAuto:
    case SanitizerMode::kPassthrough:
    // NVTX registration of slabs and blocks is not implemented yet: passthrough is the
    // mode under which memcheck sees every allocation.
    case SanitizerMode::kNvtx:
      *reason = "compute-sanitizer detected";
      return true;
  }
  return true;
}

}  // namespace cudalloc::shim
