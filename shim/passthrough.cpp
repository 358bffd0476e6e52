#include "shim/passthrough.h"

#include <cstring>

namespace cudalloc::shim {

namespace {

// What CUDALLOC_SANITIZER=auto (the default) does under the sanitizer: keep caching and
// register with NVTX, with which memcheck reports overflows against the requested size, reused
// blocks included, with no false positive (scripts/gpu-test sanitizer_nvtx_* checks it).
// Without an NVTX tool to register with, nvtx mode falls back to passthrough.
constexpr CacheMode kAutoUnderSanitizer = CacheMode::kNvtx;

}  // namespace

SanitizerEnv sanitizer_env(char** envp) {
  SanitizerEnv s;
  if (envp == nullptr) return s;
  for (char** e = envp; *e != nullptr; ++e) {
    if (std::strncmp(*e, "NV_SANITIZER_", 13) == 0) s.detected = true;
    if (std::strncmp(*e, "NVTX_INJECTION64_PATH=", 22) == 0 && (*e)[22] != '\0') {
      s.nvtx_injection = true;
      // The library's own name (libsanitizer-collection.so), not a folder on its path: cudalloc
      // names itself there for trace_nvtx, from wherever it was built.
      const char* slash = std::strrchr(*e + 22, '/');
      if (std::strstr(slash != nullptr ? slash + 1 : *e + 22, "sanitizer") != nullptr) s.detected = true;
    }
  }
  return s;
}

CacheMode choose_mode(const Config& config, const SanitizerEnv& env, const char** reason) {
  *reason = "";
  if (config.no_caching) {
    *reason = "CUDALLOC_NO_CACHING=1";
    return CacheMode::kPassthrough;
  }
  if (!env.detected) return CacheMode::kCaching;
  CacheMode mode = CacheMode::kPassthrough;
  switch (config.sanitizer) {
    case SanitizerMode::kOff:
      return CacheMode::kCaching;
    case SanitizerMode::kAuto:
      *reason = "compute-sanitizer detected";
      mode = kAutoUnderSanitizer;
      break;
    case SanitizerMode::kPassthrough:
      *reason = "compute-sanitizer detected, CUDALLOC_SANITIZER=passthrough";
      break;
    case SanitizerMode::kNvtx:
      *reason = "compute-sanitizer detected, CUDALLOC_SANITIZER=nvtx";
      mode = CacheMode::kNvtx;
      break;
  }
  // With no NVTX tool to receive them the registrations would go nowhere, and memcheck would
  // be blind inside the cache.
  if (mode == CacheMode::kNvtx && !env.nvtx_injection) {
    *reason = "compute-sanitizer detected, but no NVTX_INJECTION64_PATH to register the cache with";
    return CacheMode::kPassthrough;
  }
  return mode;
}

}  // namespace cudalloc::shim
