#include "allocator/memory_stats.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>

namespace cudalloc {
namespace {

constexpr const char* kStatTypeNames[kStatTypes] = {"all", "small_pool", "large_pool"};

struct NamedArray {
  const char* name;
  const StatArray MemoryStats::*array;
};

constexpr NamedArray kArrays[] = {
    {"allocation", &MemoryStats::allocation},
    {"segment", &MemoryStats::segment},
    {"active", &MemoryStats::active},
    {"inactive_split", &MemoryStats::inactive_split},
    {"allocated_bytes", &MemoryStats::allocated_bytes},
    {"reserved_bytes", &MemoryStats::reserved_bytes},
    {"active_bytes", &MemoryStats::active_bytes},
    {"inactive_split_bytes", &MemoryStats::inactive_split_bytes},
    {"requested_bytes", &MemoryStats::requested_bytes},
};

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string lpad(std::string s, std::size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

}  // namespace

std::map<std::string, std::int64_t> MemoryStats::to_map() const {
  std::map<std::string, std::int64_t> out;
  for (const auto& named : kArrays) {
    const StatArray& a = this->*named.array;
    for (std::size_t t = 0; t < kStatTypes; ++t) {
      const std::string prefix = std::string(named.name) + "." + kStatTypeNames[t] + ".";
      out[prefix + "current"] = a[t].current;
      out[prefix + "peak"] = a[t].peak;
      out[prefix + "allocated"] = a[t].allocated;
      out[prefix + "freed"] = a[t].freed;
    }
  }
  out["num_alloc_retries"] = num_alloc_retries;
  out["num_ooms"] = num_ooms;
  out["num_pending_waits"] = num_pending_waits;
  out["num_device_alloc"] = num_device_alloc;
  out["num_device_free"] = num_device_free;
  out["num_cache_hits"] = num_cache_hits;
  out["num_cache_misses"] = num_cache_misses;
  out["num_locked_allocs"] = num_locked_allocs;
  out["num_locked_frees"] = num_locked_frees;
  out["num_bridged_allocs"] = num_bridged_allocs;
  out["num_remaps"] = num_remaps;
  out["num_remapped_pages"] = num_remapped_pages;
  out["num_remap_waits"] = num_remap_waits;
  out["oversize_allocations.current"] = oversize_allocations;
  out["oversize_segments.current"] = oversize_segments;
  out["thread_caches.current"] = thread_caches;
  out["thread_cache_bytes.current"] = thread_cache_bytes;
  out["thread_cache_bytes.max_thread"] = thread_cache_max_bytes;
  return out;
}

void MemoryStats::reset_peaks() {
  for (const auto& named : kArrays) {
    StatArray& a = const_cast<StatArray&>(this->*named.array);
    for (Stat& s : a) s.reset_peak();
  }
}

void MemoryStats::forget_held() {
  for (const auto& named : kArrays) const_cast<StatArray&>(this->*named.array) = StatArray{};
  oversize_allocations = 0;
  oversize_segments = 0;
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char buf[48];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", value, kUnits[unit]);
  }
  return buf;
}

SummarySection::SummarySection() : out_('|' + std::string(77, '-') + "|\n") {}

void SummarySection::row(const char* format, ...) {
  char text[240];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  std::string line(" ");
  line += text;
  line.resize(std::max<std::size_t>(line.size(), 77), ' ');
  out_ += '|';
  out_ += line;
  out_ += "|\n";
}

std::string SummarySection::finish() {
  out_ += '|' + std::string(77, '-') + "|\n";
  return std::move(out_);
}

std::string format_memory_summary(const MemoryStats& s, int device, std::size_t limit_bytes, std::string_view note) {
  constexpr std::size_t kW = 16;
  std::string out;
  // One framed row. Appended piece by piece: "|" + std::string temporaries trip GCC 12's
  // -Wrestrict false positive at -O3.
  auto row = [&out](const std::string& text) {
    out += '|';
    out += text;
    out += "|\n";
  };
  const std::string rule(79, '=');
  const std::string thin(79, '-');
  row(rule.substr(2));
  char title[96];
  std::snprintf(title, sizeof title, " cudalloc memory summary, device %d, limit %s", device,
                format_bytes(limit_bytes).c_str());
  row(pad(title, 77));
  row(thin.substr(2));
  row(pad(" Metric", 29) + lpad("Cur Usage", kW) + lpad("Peak Usage", kW) + lpad("Tot Alloc", kW));
  row(thin.substr(2));

  auto bytes_row = [&](const char* name, const StatArray& a) {
    for (std::size_t t = 0; t < kStatTypes; ++t) {
      std::string label = t == kStatAll ? std::string(" ") + name : std::string("   from ") + kStatTypeNames[t];
      row(pad(label, 29) + lpad(format_bytes(a[t].current), kW) + lpad(format_bytes(a[t].peak), kW) +
          lpad(format_bytes(a[t].allocated), kW));
    }
  };
  auto count_row = [&](const char* name, const StatArray& a) {
    row(pad(std::string(" ") + name, 29) + lpad(std::to_string(a[kStatAll].current), kW) +
        lpad(std::to_string(a[kStatAll].peak), kW) + lpad(std::to_string(a[kStatAll].allocated), kW));
  };
  bytes_row("Allocated memory", s.allocated_bytes);
  bytes_row("Active memory", s.active_bytes);
  bytes_row("Requested memory", s.requested_bytes);
  bytes_row("Reserved memory", s.reserved_bytes);
  bytes_row("Non-releasable memory", s.inactive_split_bytes);
  row(thin.substr(2));
  count_row("Allocations", s.allocation);
  count_row("Active allocs", s.active);
  count_row("Reserved segments", s.segment);
  count_row("Non-releasable allocs", s.inactive_split);
  row(thin.substr(2));
  char line[160];
  std::snprintf(line, sizeof line,
                " device allocs: %lld  device frees: %lld  cache hits: %lld  misses: %lld",
                static_cast<long long>(s.num_device_alloc), static_cast<long long>(s.num_device_free),
                static_cast<long long>(s.num_cache_hits), static_cast<long long>(s.num_cache_misses));
  row(pad(line, 77));
  std::snprintf(line, sizeof line, " alloc retries: %lld  OOMs: %lld  fence waits: %lld",
                static_cast<long long>(s.num_alloc_retries), static_cast<long long>(s.num_ooms),
                static_cast<long long>(s.num_pending_waits));
  row(pad(line, 77));
  std::snprintf(line, sizeof line, " under the device lock: allocs %lld (bridges %lld)  frees %lld",
                static_cast<long long>(s.num_locked_allocs), static_cast<long long>(s.num_bridged_allocs),
                static_cast<long long>(s.num_locked_frees));
  row(pad(line, 77));
  if (s.thread_caches != 0) {
    std::snprintf(line, sizeof line, " thread caches: %lld threads hold %s (one thread at most %s)",
                  static_cast<long long>(s.thread_caches),
                  format_bytes(static_cast<std::uint64_t>(s.thread_cache_bytes)).c_str(),
                  format_bytes(static_cast<std::uint64_t>(s.thread_cache_max_bytes)).c_str());
    row(pad(line, 77));
  }
  if (s.num_remaps != 0) {
    std::snprintf(line, sizeof line, " page stitching: %lld growths took %lld free pages, %lld waited",
                  static_cast<long long>(s.num_remaps), static_cast<long long>(s.num_remapped_pages),
                  static_cast<long long>(s.num_remap_waits));
    row(pad(line, 77));
  }
  if (!note.empty()) {
    std::string noted(1, ' ');
    noted.append(note);
    row(pad(noted, 77));
  }
  row(rule.substr(2));
  return out;
}

}  // namespace cudalloc
