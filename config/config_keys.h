// The CUDALLOC_CONF keys, one descriptor each: the parser reads values by them, its errors list
// them, and README's configuration table is printed from them (cudalloc-replay
// --print-config-table), so that a key cannot be added to one and missed by the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "config/settings.h"

namespace cudalloc {

enum class KeyKind {
  kBool,       // true or false, in any case
  kMiB,        // an integer number of MiB from `min`, stored in bytes
  kFraction,   // a number above 0 and below 1 (or at most 1: `max_inclusive`)
  kCount,      // an integer from `min` to `max`
  kChoice,     // one of two names, in any case: the first sets `flag`, the second clears it
  kDivisions,  // roundup_power2_divisions: a power of two, or PyTorch's [K:D,...] list
};

struct ConfigKey {
  std::string_view name;
  KeyKind kind;
  std::uint64_t min = 0;        // kMiB, kCount: the smallest value accepted
  std::uint64_t max = 0;        // kCount: the largest value accepted
  bool max_inclusive = false;   // kFraction: 1 itself is accepted
  std::string_view range_note{};  // kMiB: why the range starts where it does, after it in errors
  std::string_view choices[2]{};  // kChoice
  // Where the value goes: flag for kBool and kChoice, size for kMiB (bytes) and kCount,
  // number for kFraction; kDivisions fills AllocatorOptions::roundup_power2_divisions.
  bool& (*flag)(Config&) = nullptr;
  std::size_t& (*size)(Config&) = nullptr;
  double& (*number)(Config&) = nullptr;
  // README's configuration table: the key as written, its default as describe() prints it,
  // what it does.
  std::string_view syntax{};
  std::string_view default_text{};
  std::string_view help{};
};

// Every key, in the order errors list them.
std::span<const ConfigKey> config_keys();

// "max_split_size_mb, garbage_collection_threshold, ...": what errors call the accepted keys.
std::string accepted_keys();

// README's configuration table in Markdown: the header, the separator and one row per key.
std::string config_table();

}  // namespace cudalloc
