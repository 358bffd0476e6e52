// Reading cudalloc's configuration (settings.h): CUDALLOC_CONF (PyTorch's
// PYTORCH_CUDA_ALLOC_CONF syntax and key names) plus the CUDALLOC_* environment variables.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "config/settings.h"

namespace cudalloc {

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
