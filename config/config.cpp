// CUDALLOC_CONF parsing (PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax) and the CUDALLOC_*
// environment variables. Nothing here logs or throws; errors come back as one line.
#include "config/config.h"

#include "allocator/size_classes.h"
#include "config/config_keys.h"

#include <stdlib.h>  // secure_getenv (glibc)

#include <algorithm>
#include <array>
#include <utility>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>

namespace cudalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::uint64_t kMaxMb = std::numeric_limits<std::size_t>::max() / kMiB;
// Values quoted in error lines are cut to this many characters.
constexpr std::size_t kMaxQuoted = 64;

// PyTorch allocator keys that cudalloc recognises but does not implement.
constexpr std::array<std::string_view, 11> kPytorchOnlyKeys = {
    "backend",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
    "max_non_split_rounding_mb",
    "garbage_collect_threshold",
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// Quotes untrusted text for an error line: control and non-ASCII bytes become \xNN (so the
// line stays one line) and long text is cut.
std::string quote(std::string_view s) {
  std::string out;
  const bool cut = s.size() > kMaxQuoted;
  if (cut) s = s.substr(0, kMaxQuoted);
  out.reserve(s.size() + 8);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += ch;
    }
  }
  if (cut) out += "...";
  return out;
}

// "CUDALLOC_CONF: key:value is not accepted: why"
std::string conf_error(std::string_view key, std::string_view value, std::string_view why) {
  std::string out = "CUDALLOC_CONF: ";
  out += quote(key);
  out += ':';
  out += quote(value);
  out += " is not accepted: ";
  out += why;
  return out;
}

// "NAME=value is not accepted: why"
std::string env_error(std::string_view name, std::string_view value, std::string_view why) {
  std::string out(name);
  out += '=';
  out += quote(value);
  out += " is not accepted: ";
  out += why;
  return out;
}

// Parses a whole string as an unsigned decimal integer. On failure `why` says what is wrong
// with it ("is negative", "is not a number", ...) for the caller to prefix.
bool parse_u64(std::string_view s, std::uint64_t& out, std::string& why) {
  if (s.empty()) {
    why = "empty value";
    return false;
  }
  if (s.front() == '-') {
    why = "negative value";
    return false;
  }
  if (s.front() < '0' || s.front() > '9') {
    why = "not a number";
    return false;
  }
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  if (ec == std::errc::result_out_of_range) {
    why = "number too large";
    return false;
  }
  if (ec != std::errc{}) {
    why = "not a number";
    return false;
  }
  if (ptr != s.data() + s.size()) {
    why = "trailing characters after the number";
    return false;
  }
  out = v;
  return true;
}

// Parses a whole string as a finite decimal floating-point number.
bool parse_double(std::string_view s, double& out, std::string& why) {
  if (s.empty()) {
    why = "empty value";
    return false;
  }
  if (s.front() == '-') {
    why = "negative value";
    return false;
  }
  // from_chars also takes "inf" and "nan"; only plain decimals are meant here.
  if (!((s.front() >= '0' && s.front() <= '9') || s.front() == '.')) {
    why = "not a number";
    return false;
  }
  double v = 0.0;
  const auto [ptr, ec] =
      std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) {
    why = "number out of range";
    return false;
  }
  if (ec != std::errc{}) {
    why = "not a number";
    return false;
  }
  if (ptr != s.data() + s.size()) {
    why = "trailing characters after the number";
    return false;
  }
  if (!std::isfinite(v)) {
    why = "not a finite number";
    return false;
  }
  out = v;
  return true;
}

bool parse_bool(std::string_view s, bool& out) {
  if (iequals(s, "true")) {
    out = true;
    return true;
  }
  if (iequals(s, "false")) {
    out = false;
    return true;
  }
  return false;
}

bool power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

static_assert(kMaxRoundupDivisions == 1048576, "the messages below name the bound");

// Divisions PyTorch would accept (a power of two) and cudalloc can honour: at most
// kMaxRoundupDivisions. An empty string when `d` is fine, else why not.
std::string divisions_problem(std::uint64_t d) {
  if (d == 0) return {};
  if (!power_of_two(d)) return "not a power of two or 0";
  if (d > kMaxRoundupDivisions) return "more than " + std::to_string(kMaxRoundupDivisions);
  return {};
}

// PyTorch's interval index of a list key of `mb` MiB (a power of two): log2(mb), clamped
// to the last interval.
std::size_t roundup_index(std::uint64_t mb) {
  const auto log2 = static_cast<std::size_t>(std::bit_width(mb) - 1);
  return std::min(log2, kRoundupIntervals - 1);
}

std::string mb_error_text(std::string_view prefix, std::uint64_t min) {
  std::string s(prefix);
  s += "an integer number of MiB from ";
  s += std::to_string(min);
  s += " to ";
  s += std::to_string(kMaxMb);
  return s;
}

// Each parse_* returns an empty string on success, else the error line.

std::string parse_mb(std::string_view key, std::string_view value, std::uint64_t min,
                     std::string_view min_note, std::size_t& out) {
  std::uint64_t v = 0;
  std::string why;
  std::string expected = mb_error_text("expected ", min);
  expected += min_note;
  if (!parse_u64(value, v, why)) return conf_error(key, value, why + "; " + expected);
  if (v < min || v > kMaxMb) return conf_error(key, value, "out of range; " + expected);
  out = static_cast<std::size_t>(v) * kMiB;
  return {};
}

std::string parse_roundup(std::string_view value,
                          std::array<std::size_t, kRoundupIntervals>& out) {
  constexpr std::string_view key = "roundup_power2_divisions";
  constexpr std::string_view single_expected =
      "expected a power of two up to 1048576 (0 or 1: no rounding; PyTorch also requires a power "
      "of two) or a list such as [256:1,512:2,1024:4,>:8]";
  constexpr std::string_view list_expected =
      "expected [K:D,...,>:D] with K a power-of-two size in MiB, D 0 or a power of two up to "
      "1048576, and an optional final >:D";
  std::string why;

  if (value.front() != '[') {
    std::uint64_t d = 0;
    if (!parse_u64(value, d, why)) {
      return conf_error(key, value, why + "; " + std::string(single_expected));
    }
    if (const std::string bad = divisions_problem(d); !bad.empty()) {
      return conf_error(key, value, bad + "; " + std::string(single_expected));
    }
    out.fill(static_cast<std::size_t>(d));
    return {};
  }

  // List form. The top-level splitter has already checked that the brackets balance, that
  // they do not nest and that ']' ends the value.
  if (value.back() != ']') {
    return conf_error(key, value, "unbalanced brackets; " + std::string(list_expected));
  }
  std::string_view body = value.substr(1, value.size() - 2);
  if (trim(body).empty()) {
    return conf_error(key, value, "empty list; " + std::string(list_expected));
  }

  std::array<std::size_t, kRoundupIntervals> result{};
  bool have_key = false;       // at least one K:D seen
  bool have_rest = false;      // >:D seen
  std::size_t last_index = 0;  // interval of the last K seen
  while (true) {
    const std::size_t comma = body.find(',');
    const std::string_view item = trim(body.substr(0, comma));
    const bool last_item = comma == std::string_view::npos;
    if (item.empty()) {
      return conf_error(key, value, "empty list entry; " + std::string(list_expected));
    }
    if (have_rest) {
      return conf_error(key, value,
                        "'>' must be the last list entry; " + std::string(list_expected));
    }
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      return conf_error(key, value,
                        "list entry '" + quote(item) + "' has no ':'; " +
                            std::string(list_expected));
    }
    const std::string_view size_text = trim(item.substr(0, colon));
    const std::string_view div_text = trim(item.substr(colon + 1));

    std::uint64_t d = 0;
    if (!parse_u64(div_text, d, why)) {
      return conf_error(key, value,
                        "divisions '" + quote(div_text) + "': " + why + "; " +
                            std::string(list_expected));
    }
    if (const std::string bad = divisions_problem(d); !bad.empty()) {
      return conf_error(key, value, "divisions " + std::to_string(d) + " is " + bad + "; " + std::string(list_expected));
    }
    const auto divisions = static_cast<std::size_t>(d);

    // PyTorch's reading (c10 AllocatorConfig): the first key also covers every smaller
    // interval, each later key only its own, '>' every interval above the last key's; the
    // rest is not rounded. So a config copied from PyTorch rounds the same sizes.
    if (size_text == ">") {
      std::fill(result.begin() + static_cast<std::ptrdiff_t>(last_index + 1), result.end(), divisions);
      have_rest = true;
    } else {
      std::uint64_t mb = 0;
      if (!parse_u64(size_text, mb, why)) {
        return conf_error(key, value,
                          "size '" + quote(size_text) + "': " + why + "; " +
                              std::string(list_expected));
      }
      if (!power_of_two(mb)) {
        return conf_error(key, value,
                          "size " + std::to_string(mb) + " MiB is not a power of two; " +
                              std::string(list_expected));
      }
      const std::size_t index = roundup_index(mb);
      if (!have_key) std::fill(result.begin(), result.begin() + static_cast<std::ptrdiff_t>(index), divisions);
      result[index] = divisions;
      have_key = true;
      last_index = index;
    }
    if (last_item) break;
    body.remove_prefix(comma + 1);
  }
  out = result;
  return {};
}

std::string parse_entry(const ConfigKey& k, std::string_view key, std::string_view value, Config& c) {
  std::string why;
  switch (k.kind) {
    case KeyKind::kMiB:
      return parse_mb(key, value, k.min, k.range_note, k.size(c));
    case KeyKind::kFraction: {
      const std::string_view expected = k.max_inclusive ? "expected a number greater than 0 and at most 1"
                                                        : "expected a number between 0 and 1 (exclusive)";
      double v = 0.0;
      if (!parse_double(value, v, why)) {
        return conf_error(key, value, why + "; " + std::string(expected));
      }
      if (!(v > 0.0 && (k.max_inclusive ? v <= 1.0 : v < 1.0))) return conf_error(key, value, expected);
      k.number(c) = v;
      return {};
    }
    case KeyKind::kDivisions:
      return parse_roundup(value, c.allocator.roundup_power2_divisions);
    case KeyKind::kBool: {
      bool v = false;
      if (!parse_bool(value, v)) {
        return conf_error(key, value, "expected true or false (any case)");
      }
      k.flag(c) = v;
      return {};
    }
    case KeyKind::kChoice:
      if (iequals(value, k.choices[0])) {
        k.flag(c) = true;
      } else if (iequals(value, k.choices[1])) {
        k.flag(c) = false;
      } else {
        return conf_error(key, value,
                          "expected " + std::string(k.choices[0]) + " or " + std::string(k.choices[1]) + " (any case)");
      }
      return {};
    case KeyKind::kCount: {
      const std::string expected = "expected an integer from " + std::to_string(k.min) + " to " + std::to_string(k.max);
      std::uint64_t v = 0;
      if (!parse_u64(value, v, why)) return conf_error(key, value, why + "; " + expected);
      if (v < k.min || v > k.max) return conf_error(key, value, "out of range; " + expected);
      k.size(c) = static_cast<std::size_t>(v);
      return {};
    }
  }
  return conf_error(key, value, "internal error: unhandled key");
}

// Handles one "key:value" entry (already trimmed, non-empty).
std::string handle_entry(std::string_view entry, unsigned& seen, Config& c) {
  const std::size_t colon = entry.find(':');
  if (colon == std::string_view::npos) {
    return "CUDALLOC_CONF: entry '" + quote(entry) +
           "' is not accepted: bad separator, expected key:value";
  }
  const std::string_view key = trim(entry.substr(0, colon));
  const std::string_view value = trim(entry.substr(colon + 1));
  if (key.empty()) {
    return "CUDALLOC_CONF: entry '" + quote(entry) +
           "' is not accepted: empty key, expected key:value";
  }

  // PyTorch's default backend is what cudalloc is: a config copied from PyTorch may name it.
  if (key == "backend" && value == "native") return {};
  // Pinned memory: PyTorch's defaults are what cudalloc does (cudaHostAlloc'd memory, no
  // background thread); host registration and background threads are refused below.
  if ((key == "pinned_use_cuda_host_register" || key == "pinned_use_background_threads") && iequals(value, "false")) {
    return {};
  }
  const std::span<const ConfigKey> keys = config_keys();
  unsigned index = 0;
  while (index < keys.size() && keys[index].name != key) ++index;
  if (index == keys.size()) {
    if (std::find(kPytorchOnlyKeys.begin(), kPytorchOnlyKeys.end(), key) !=
        kPytorchOnlyKeys.end()) {
      return conf_error(key, value,
                        std::string(key) +
                            " is a PyTorch allocator key that cudalloc does not support; "
                            "accepted keys: " +
                            accepted_keys());
    }
    return conf_error(key, value,
                      "unknown key '" + quote(key) + "'; accepted keys: " +
                          accepted_keys());
  }
  if (value.empty()) {
    return conf_error(key, value, "empty value for " + std::string(key));
  }
  const unsigned bit = 1u << index;
  if ((seen & bit) != 0) {
    return conf_error(key, value, "duplicate key, " + std::string(key) + " may be given once");
  }
  seen |= bit;
  return parse_entry(keys[index], key, value, c);
}

ConfigResult fail(std::string error) {
  ConfigResult r;
  r.error = std::move(error);
  return r;
}

ConfigResult parse_alloc_conf_impl(std::string_view text, const Config& base) {
  Config c = base;
  if (trim(text).empty()) {
    ConfigResult r;
    r.config = std::move(c);
    return r;
  }
  unsigned seen = 0;
  std::size_t pos = 0;
  bool after_comma = false;
  while (pos < text.size()) {
    // Find the end of this entry: the next ',' outside brackets.
    std::size_t end = pos;
    std::size_t open = std::string_view::npos;  // position of the pending '['
    bool closed = false;                        // a ']' has closed the bracket of this entry
    for (; end < text.size(); ++end) {
      const char ch = text[end];
      if (ch == '[') {
        if (open != std::string_view::npos || closed) {
          return fail("CUDALLOC_CONF: entry '" + quote(trim(text.substr(pos, end + 1 - pos))) +
                      "...' is not accepted: nested or repeated '[', only one [...] list "
                      "per entry is accepted");
        }
        open = end;
      } else if (ch == ']') {
        if (open == std::string_view::npos) {
          return fail("CUDALLOC_CONF: entry '" + quote(trim(text.substr(pos, end + 1 - pos))) +
                      "' is not accepted: unbalanced brackets, ']' without '['");
        }
        open = std::string_view::npos;
        closed = true;
      } else if (ch == ',' && open == std::string_view::npos) {
        break;
      } else if (closed && !is_space(ch)) {
        return fail("CUDALLOC_CONF: entry '" + quote(trim(text.substr(pos, end + 1 - pos))) +
                    "' is not accepted: characters after ']', expected ',' or the end");
      }
    }
    if (open != std::string_view::npos) {
      return fail("CUDALLOC_CONF: entry '" + quote(trim(text.substr(pos))) +
                  "' is not accepted: unbalanced brackets, '[' without ']'");
    }
    const std::string_view entry = trim(text.substr(pos, end - pos));
    const bool at_end = end >= text.size();
    if (entry.empty()) {
      // One trailing comma is tolerated, as PyTorch does; any other empty entry is an error.
      if (!(at_end && after_comma)) {
        return fail("CUDALLOC_CONF: empty entry at offset " + std::to_string(pos) +
                    " is not accepted: expected key:value entries separated by single commas");
      }
    } else {
      std::string error = handle_entry(entry, seen, c);
      if (!error.empty()) return fail(std::move(error));
    }
    if (at_end) break;
    pos = end + 1;
    after_comma = true;
    // "a:b," ends right after the comma: a tolerated trailing comma.
    if (pos == text.size()) break;
  }
  ConfigResult r;
  r.config = std::move(c);
  return r;
}

// Env flags: 1/0/true/false (any case, surrounding spaces ignored).
std::string env_flag(const char* name, const std::string& raw, bool& out) {
  const std::string_view v = trim(raw);
  if (v == "1") {
    out = true;
  } else if (v == "0") {
    out = false;
  } else if (!parse_bool(v, out)) {
    return env_error(name, raw, "expected 1, 0, true or false");
  }
  return {};
}

std::string env_path(const char* name, const std::string& raw, std::string& out) {
  if (raw.empty()) return env_error(name, raw, "expected a non-empty file path");
  out = raw;
  return {};
}

// One of a fixed set of names, in any case.
template <typename T, std::size_t N>
std::string env_choice(const char* variable, const std::string& raw,
                       const std::array<std::pair<std::string_view, T>, N>& choices, T& out,
                       const char* accepted) {
  const std::string_view v = trim(raw);
  for (const auto& [name, value] : choices) {
    if (iequals(v, name)) {
      out = value;
      return {};
    }
  }
  return env_error(variable, raw, accepted);
}

std::string env_log_level(const std::string& raw, LogLevel& out) {
  static constexpr std::array<std::pair<std::string_view, LogLevel>, 7> kLevels = {{
      {"trace", LogLevel::kTrace},
      {"debug", LogLevel::kDebug},
      {"info", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},
      {"warning", LogLevel::kWarn},
      {"error", LogLevel::kError},
      {"off", LogLevel::kOff},
  }};
  return env_choice("CUDALLOC_LOG_LEVEL", raw, kLevels, out,
                    "expected one of trace, debug, info, warn, warning, error, off (any case)");
}

std::string env_sanitizer(const std::string& raw, SanitizerMode& out) {
  static constexpr std::array<std::pair<std::string_view, SanitizerMode>, 4> kModes = {{
      {"auto", SanitizerMode::kAuto},
      {"passthrough", SanitizerMode::kPassthrough},
      {"nvtx", SanitizerMode::kNvtx},
      {"off", SanitizerMode::kOff},
  }};
  return env_choice("CUDALLOC_SANITIZER", raw, kModes, out,
                    "expected one of auto, passthrough, nvtx, off (any case)");
}

ConfigResult load_config_impl(const EnvLookup& env) {
  Config c;
  if (!env) return fail("cudalloc: no environment lookup given");
  if (const auto conf = env("CUDALLOC_CONF")) {
    ConfigResult r = parse_alloc_conf_impl(*conf, c);
    if (!r.config) return r;
    c = std::move(*r.config);
  }
  std::string error;
  if (const auto v = env("CUDALLOC_NO_CACHING")) {
    if (!(error = env_flag("CUDALLOC_NO_CACHING", *v, c.no_caching)).empty()) return fail(error);
  }
  if (const auto v = env("CUDALLOC_TRACE")) {
    if (!(error = env_path("CUDALLOC_TRACE", *v, c.trace_path)).empty()) return fail(error);
  }
  if (const auto v = env("CUDALLOC_LOG_LEVEL")) {
    if (!(error = env_log_level(*v, c.log_level)).empty()) return fail(error);
  }
  if (const auto v = env("CUDALLOC_LOG_FILE")) {
    if (!(error = env_path("CUDALLOC_LOG_FILE", *v, c.log_file)).empty()) return fail(error);
  }
  if (const auto v = env("CUDALLOC_STATS")) {
    if (!(error = env_flag("CUDALLOC_STATS", *v, c.stats_at_exit)).empty()) return fail(error);
  }
  if (const auto v = env("CUDALLOC_SANITIZER")) {
    if (!(error = env_sanitizer(*v, c.sanitizer)).empty()) return fail(error);
  }
  ConfigResult r;
  r.config = std::move(c);
  return r;
}

std::string format_double(double v) {
  char buf[32];
  const int n = std::snprintf(buf, sizeof buf, "%g", v);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(std::min<int>(n, sizeof buf - 1)))
               : std::string("?");
}

// Bytes as a MiB count when exact, else as "<bytes>B".
std::string format_mb(std::size_t bytes) {
  if (bytes % kMiB == 0) return std::to_string(bytes / kMiB);
  return std::to_string(bytes) + "B";
}

// The divisions table in the list syntax parse_alloc_conf reads back: K:D for the run of equal
// values the table starts with (the first key covers every smaller interval), K:D for each
// later interval that rounds, and '>:D' for a run of equal values to the end (after a key for
// the interval just before it).
std::string format_roundup(const std::array<std::size_t, kRoundupIntervals>& d) {
  const bool uniform = std::all_of(d.begin(), d.end(), [&](std::size_t v) { return v == d[0]; });
  if (uniform) return d[0] <= 1 ? std::string("off") : std::to_string(d[0]);
  std::size_t rest = d.size();  // where the run of equal values to the end starts, if it rounds
  while (rest > 1 && d[rest - 1] == d.back()) --rest;
  if (d.back() == 0 || rest == d.size() - 1) rest = d.size();
  std::size_t lead = 0;
  while (lead + 1 < rest && d[lead + 1] == d[0]) ++lead;
  std::string out = '[' + std::to_string(std::size_t{1} << lead) + ':' + std::to_string(d[0]);
  for (std::size_t i = lead + 1; i < rest; ++i) {
    if (d[i] == 0 && !(rest < d.size() && i + 1 == rest)) continue;
    out += ',' + std::to_string(std::size_t{1} << i) + ':' + std::to_string(d[i]);
  }
  if (rest < d.size()) out += ",>:" + std::to_string(d.back());
  out += ']';
  return out;
}

std::string_view level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "?";
}

std::string_view sanitizer_name(SanitizerMode m) {
  switch (m) {
    case SanitizerMode::kAuto: return "auto";
    case SanitizerMode::kPassthrough: return "passthrough";
    case SanitizerMode::kNvtx: return "nvtx";
    case SanitizerMode::kOff: return "off";
  }
  return "?";
}

// Paths in the one-line description: control bytes escaped, not cut.
std::string escape_path(std::string_view s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

EnvLookup process_env() {
  return [](const char* name) -> std::optional<std::string> {
    if (name == nullptr) return std::nullopt;
    // secure_getenv: nothing under secure execution (setuid/setgid, capabilities).
    const char* v = ::secure_getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

ConfigResult parse_alloc_conf(std::string_view text, const Config& base) {
  try {
    return parse_alloc_conf_impl(text, base);
  } catch (...) {
    return fail("CUDALLOC_CONF: could not be parsed (out of memory)");
  }
}

ConfigResult load_config(const EnvLookup& env) {
  try {
    return load_config_impl(env);
  } catch (...) {
    return fail("cudalloc: could not read the configuration (out of memory or lookup failure)");
  }
}

std::string describe(const Config& config) {
  try {
    const AllocatorOptions& a = config.allocator;
    std::string s;
    s += "max_split_size_mb=";
    s += a.max_split_size == std::numeric_limits<std::size_t>::max() ? "unlimited"
                                                                      : format_mb(a.max_split_size);
    s += " garbage_collection_threshold=";
    s += a.garbage_collection_threshold > 0.0 ? format_double(a.garbage_collection_threshold)
                                              : "off";
    s += " roundup_power2_divisions=" + format_roundup(a.roundup_power2_divisions);
    s += " expandable_segments=";
    s += a.expandable_segments ? "true" : "false";
    s += " page_stitching=";
    s += a.page_stitching ? "true" : "false";
    s += " per_process_memory_fraction=" + format_double(a.per_process_memory_fraction);
    s += " memory_limit_mb=";
    s += a.memory_limit_bytes == 0 ? "none" : format_mb(a.memory_limit_bytes);
    s += " pinned_memory_limit_mb=";
    s += a.pinned_memory_limit_bytes == 0 ? "none" : format_mb(a.pinned_memory_limit_bytes);
    s += " free_sync=";
    s += config.free_sync ? "true" : "false";
    s += " single_stream=";
    s += config.single_stream ? "true" : "false";
    s += " watch_submissions=";
    s += config.watch_submissions ? "true" : "false";
    s += " trace_stacks=" + std::to_string(config.trace_stacks);
    s += " trace_nvtx=";
    s += config.trace_nvtx ? "true" : "false";
    s += " trace_clock=";
    s += config.trace_tsc ? "tsc" : "monotonic";
    s += " free_epoch_mb=" + std::to_string(config.allocator.free_epoch_bytes / (std::size_t{1} << 20));
    s += " max_pending_mb=" + std::to_string(config.allocator.max_pending_bytes / (std::size_t{1} << 20));
    s += " thread_cache=";
    s += config.allocator.thread_cache ? "true" : "false";
    s += " no_caching=";
    s += config.no_caching ? "true" : "false";
    s += " trace=";
    s += config.trace_path.empty() ? "off" : escape_path(config.trace_path);
    s += " log_level=";
    s += level_name(config.log_level);
    s += " log_file=";
    s += config.log_file.empty() ? "default" : escape_path(config.log_file);
    s += " stats=";
    s += config.stats_at_exit ? "true" : "false";
    s += " sanitizer=";
    s += sanitizer_name(config.sanitizer);
    return s;
  } catch (...) {
    return "(configuration description unavailable: out of memory)";
  }
}

}  // namespace cudalloc
