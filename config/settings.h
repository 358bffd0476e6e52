// What cudalloc's configuration holds: the allocator's options and the shim's own settings.
// Apart from the parser (config.h), so that the key table (config_keys.h) can name the fields
// the parser fills without including the parser.
#pragma once

#include <cstddef>
#include <string>

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
  bool watch_submissions = true; // watch_submissions: reuse a cudaFree'd block at once while no work was queued
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

}  // namespace cudalloc
