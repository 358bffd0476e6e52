// libFuzzer target: CUDALLOC_CONF and the CUDALLOC_* variables.
//
// Input: byte 0 picks the mode; the rest is split on NUL bytes.
//   mode even: parse_alloc_conf(rest) on a default Config, then again on the result (a
//              successful parse must parse again over itself, and describe() must not crash).
//   mode odd:  load_config() through a fake environment: the NUL-separated pieces are the
//              values of CUDALLOC_CONF, _NO_CACHING, _TRACE, _LOG_LEVEL, _LOG_FILE, _STATS,
//              _SANITIZER in that order (a missing piece = unset). Bit 1 of the mode appends
//              1 MiB of the last piece's first byte to CUDALLOC_CONF (huge environment values).
// Checked: no crash or sanitizer report; a result is either a config or a one-line error;
// parsed options lie in the ranges the allocator assumes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/size_classes.h"
#include "config/config.h"

using namespace cudalloc;

namespace {

[[noreturn]] void violation(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_config: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_result(const ConfigResult& r) {
  if (r.config.has_value() == !r.error.empty()) {
    violation("result is neither a config nor an error (or both)", r.error);
  }
  if (!r.config) {
    if (r.error.find('\n') != std::string::npos) violation("error is not one line", r.error);
    return;
  }
  const Config& c = *r.config;
  const AllocatorOptions& a = c.allocator;
  if (!(a.garbage_collection_threshold >= 0.0 && a.garbage_collection_threshold < 1.0)) {
    violation("garbage_collection_threshold out of range", std::to_string(a.garbage_collection_threshold));
  }
  if (a.memory_limit_bytes != 0 && a.memory_limit_bytes < cudalloc::kSmallBuffer) {
    violation("memory limit below the smallest segment", std::to_string(a.memory_limit_bytes));
  }
  if (!(a.per_process_memory_fraction > 0.0 && a.per_process_memory_fraction <= 1.0)) {
    violation("per_process_memory_fraction out of range", std::to_string(a.per_process_memory_fraction));
  }
  for (std::size_t d : a.roundup_power2_divisions) {
    if (d > 1 && (d & (d - 1)) != 0) violation("roundup division not a power of two", std::to_string(d));
    if (d > cudalloc::kMaxRoundupDivisions) violation("roundup division too large to honour", std::to_string(d));
  }
  const std::string desc = describe(c);
  if (desc.find('\n') != std::string::npos) violation("describe() is not one line", desc);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned mode = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  if ((mode & 1) == 0) {
    const ConfigResult r = parse_alloc_conf(rest);
    check_result(r);
    if (r.config) {
      const ConfigResult again = parse_alloc_conf(rest, *r.config);
      check_result(again);
      if (!again.config) violation("a conf that parsed once fails over its own result", again.error);
    }
    return 0;
  }

  static const char* const kNames[] = {"CUDALLOC_CONF",      "CUDALLOC_NO_CACHING", "CUDALLOC_TRACE",
                                       "CUDALLOC_LOG_LEVEL", "CUDALLOC_LOG_FILE",   "CUDALLOC_STATS",
                                       "CUDALLOC_SANITIZER"};
  std::vector<std::string> values;
  std::size_t start = 0;
  while (start <= rest.size() && values.size() < 7) {
    std::size_t nul = rest.find('\0', start);
    if (nul == std::string_view::npos) nul = rest.size();
    values.emplace_back(rest.substr(start, nul - start));
    start = nul + 1;
  }
  if ((mode & 2) != 0 && !values.empty()) {
    const char fill = values.back().empty() ? 'x' : values.back()[0];
    values[0].append(std::size_t{1} << 20, fill);
  }
  EnvLookup env = [&](const char* name) -> std::optional<std::string> {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (std::string_view(name) == kNames[i]) return values[i];
    }
    return std::nullopt;
  };
  check_result(load_config(env));
  return 0;
}
