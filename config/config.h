// cudalloc's configuration: CUDALLOC_CONF (PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax and key
// names) plus the CUDALLOC_* environment variables.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "allocator/options.h"

namespace cudalloc {

enum class SanitizerMode {
  kAuto,         // detect compute-sanitizer; nvtx under it (passthrough without an NVTX tool)
  kPassthrough,  // under the sanitizer, send every call to the driver
  kNvtx,         // keep caching, register slabs and blocks with the NVTX memory API
  kOff,          // ignore the sanitizer
};

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

struct Config {
  AllocatorOptions allocator;

  // CUDALLOC_CONF keys beyond the allocator's own policy.
  bool free_sync = false;       // free_sync: cudaFree blocks the host like the native one
  bool single_stream = false;   // single_stream: cudaFree'd blocks are ordered on the legacy stream
  std::size_t trace_stacks = 0; // trace_stacks:N native frames per trace record
  bool trace_nvtx = false;      // trace_nvtx: record the current NVTX range name
  bool trace_tsc = true;        // trace_clock:tsc|monotonic: stamp records with the TSC where usable

  // Environment variables.
  bool no_caching = false;                          // CUDALLOC_NO_CACHING=1
  std::string trace_path;                           // CUDALLOC_TRACE
  LogLevel log_level = LogLevel::kWarn;             // CUDALLOC_LOG_LEVEL
  std::string log_file;                             // CUDALLOC_LOG_FILE
  bool stats_at_exit = false;                       // CUDALLOC_STATS=1
  SanitizerMode sanitizer = SanitizerMode::kAuto;   // CUDALLOC_SANITIZER
};

// Looks up an environment variable; nullopt when unset. Tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
EnvLookup process_env();

struct ConfigResult {
  std::optional<Config> config;  // set on success
  std::string error;             // one line naming the key, the value and what is accepted
};

// Parses a CUDALLOC_CONF string ("key:value,key:value") on top of `base`.
ConfigResult parse_alloc_conf(std::string_view text, const Config& base = Config{});

// Reads CUDALLOC_CONF and the CUDALLOC_* variables.
ConfigResult load_config(const EnvLookup& env);

// The effective configuration as one line, for the info log.
std::string describe(const Config& config);

}  // namespace cudalloc
