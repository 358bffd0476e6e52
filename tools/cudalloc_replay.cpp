// cudalloc-replay: replays an allocation trace through cudalloc's allocator core
// (DeviceAllocator) on the simulated device (SimBackend, no host memory behind pointers), under
// one or several CUDALLOC_CONF settings, and reports per setting: peak allocated, peak reserved,
// utilization (peak allocated / peak reserved), peak segment count, device calls, OOM events,
// cache hit rate and, with --min-memory, the smallest memory limit under which the whole trace
// completes without an out-of-memory failure.
//
// Input: the canonical op stream (scripts/replay converts cudalloc traces, PyTorch snapshots and
// RMM logs into it). Plain text, one op per line, fields separated by blanks:
//
//   a <id> <bytes> <stream> [async]    allocate <bytes> (> 0) for allocation <id> on <stream>
//   f <id> <stream> [async]            free allocation <id>, ordered on <stream>
//
//   <id>      unsigned decimal integer (< 2^64). An id names one live allocation; it may be
//             reused once that allocation is freed.
//   <stream>  stream handle, decimal or 0x-hex (0 = the legacy default stream), or '-' for no
//             stream: an allocation on '-' is a cudaMalloc (kNoStream); a free on '-' is a
//             cudaFree (FreeOrder::kDevice: reusable after a device-wide fence), a free on a
//             stream is a stream-ordered free (FreeOrder::kStream: reusable at once on the
//             block's own stream, elsewhere after a fence on the freeing stream).
//   async     the literal word: the call was cudaMallocAsync / cudaFreeAsync (passed through to
//             the allocator; it changes no policy today).
//   Blank lines and lines starting with '#' are ignored.
//
// Semantics of a replay: the simulated device's streams run no work (nothing is enqueued), so
// every fence the allocator records has completed by the time it is looked at: time passes
// between ops. An allocation that fails (out of memory under --limit/--total) is counted as an
// OOM event and its later free is skipped. A free of an id that is not live (never allocated,
// or already freed) and an allocation of an id that is still live are input errors: counted,
// reported on stderr (the first few, with line numbers) and skipped.
//
// Exit status: 0 on success (OOM events included), 2 on bad usage or malformed input (one line
// on stderr).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/events.h"
#include "allocator/memory_stats.h"
#include "allocator/sim_backend.h"
#include "trace/trace_writer.h"
#include "config/config.h"
#include "config/config_keys.h"

namespace {

using namespace cudalloc;

constexpr const char* kProg = "cudalloc-replay";

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n", kProg, msg.c_str());
  std::exit(2);
}

// --- the op stream

enum class OpKind : std::uint8_t { kAlloc, kFree };

struct Op {
  OpKind kind;
  bool async = false;
  std::uint32_t line = 0;
  std::uint64_t slot = 0;  // index of the allocation (one slot per allocation op)
  std::uint64_t bytes = 0;
  StreamHandle stream = 0;
};

struct Trace {
  std::vector<Op> ops;
  std::uint64_t slots = 0;
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t errors = 0;  // ops skipped as inconsistent
  std::vector<std::string> error_lines;
  std::uint64_t lines = 0;
};

std::string_view next_field(std::string_view& s) {
  std::size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) ++i;
  std::size_t j = i;
  while (j < s.size() && s[j] != ' ' && s[j] != '\t' && s[j] != '\r') ++j;
  std::string_view f = s.substr(i, j - i);
  s.remove_prefix(j);
  return f;
}

std::optional<std::uint64_t> parse_u64(std::string_view f) {
  if (f.empty()) return std::nullopt;
  int base = 10;
  if (f.size() > 2 && f[0] == '0' && (f[1] == 'x' || f[1] == 'X')) {
    base = 16;
    f.remove_prefix(2);
  }
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v, base);
  if (ec != std::errc{} || p != f.data() + f.size()) return std::nullopt;
  return v;
}

std::optional<StreamHandle> parse_stream(std::string_view f) {
  if (f == "-") return kNoStream;
  auto v = parse_u64(f);
  if (!v) return std::nullopt;
  return static_cast<StreamHandle>(*v);
}

std::string quote(std::string_view s) {
  std::string out(s.substr(0, 80));
  if (s.size() > 80) out += "...";
  return "'" + out + "'";
}

Trace read_trace(std::istream& in, const std::string& source) {
  Trace t;
  std::unordered_map<std::uint64_t, std::uint64_t> live;  // id -> slot
  std::string line;
  std::uint32_t lineno = 0;
  auto input_error = [&](const std::string& what) {
    ++t.errors;
    if (t.error_lines.size() < 5) {
      t.error_lines.push_back(source + ":" + std::to_string(lineno) + ": " + what + " (skipped)");
    }
  };
  while (std::getline(in, line)) {
    ++lineno;
    std::string_view rest = line;
    std::string_view kind = next_field(rest);
    if (kind.empty() || kind[0] == '#') continue;
    auto bad = [&](const char* expected) {
      die(source + ":" + std::to_string(lineno) + ": bad op " + quote(line) + ": expected " + expected);
    };
    if (kind == "a") {
      auto id = parse_u64(next_field(rest));
      auto bytes = parse_u64(next_field(rest));
      auto stream = parse_stream(next_field(rest));
      std::string_view flag = next_field(rest);
      if (!id || !bytes || !stream || (!flag.empty() && flag != "async") || !next_field(rest).empty()) {
        bad("'a <id> <bytes> <stream|-> [async]'");
      }
      ++t.allocs;
      if (*bytes == 0) {
        input_error("allocation of 0 bytes for id " + std::to_string(*id));
        continue;
      }
      if (live.count(*id) != 0) {
        input_error("allocation of id " + std::to_string(*id) + " which is still live");
        continue;
      }
      Op op{OpKind::kAlloc, flag == "async", lineno, t.slots++, *bytes, *stream};
      live.emplace(*id, op.slot);
      t.ops.push_back(op);
    } else if (kind == "f") {
      auto id = parse_u64(next_field(rest));
      auto stream = parse_stream(next_field(rest));
      std::string_view flag = next_field(rest);
      if (!id || !stream || (!flag.empty() && flag != "async") || !next_field(rest).empty()) {
        bad("'f <id> <stream|-> [async]'");
      }
      ++t.frees;
      auto it = live.find(*id);
      if (it == live.end()) {
        input_error("free of id " + std::to_string(*id) + " which is not live");
        continue;
      }
      t.ops.push_back(Op{OpKind::kFree, flag == "async", lineno, it->second, 0, *stream});
      live.erase(it);
    } else {
      bad("an op 'a ...' or 'f ...'");
    }
  }
  if (in.bad()) die(source + ": read error");
  t.lines = lineno;
  return t;
}

// --- sizes

std::optional<std::size_t> parse_size(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string num(s.substr(0, i));
  std::string unit(s.substr(i));
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (num.empty()) return std::nullopt;
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = double(kKiB);
  else if (unit == "m" || unit == "mib") mult = double(kMiB);
  else if (unit == "g" || unit == "gib") mult = double(kGiB);
  else if (unit == "t" || unit == "tib") mult = double(kGiB) * 1024;
  else return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(num.c_str(), &end);
  if (errno != 0 || end != num.c_str() + num.size() || !(v >= 0)) return std::nullopt;
  const double bytes = std::round(v * mult);
  if (bytes > 1.8e19) return std::nullopt;
  return static_cast<std::size_t>(bytes);
}

// --- writing a cudalloc trace (v1) of the replay

class OpTraceWriter final : public AllocatorObserver {
 public:
  explicit OpTraceWriter(std::FILE* f) : f_(f) {
    std::fprintf(f_, "#cudalloc-trace v1\n");
    std::fprintf(f_, "ts_ns,pid,tid,device,event,stream,ptr,requested,rounded,result,hit,allocated,reserved,extra\n");
    std::fprintf(f_, "# written by cudalloc-replay --write-trace (simulated device; ts_ns = op index * 1000)\n");
  }
  void set_op(std::uint64_t index) { op_ = index; }
  void on_event(const AllocatorEvent& e) noexcept override {
    char stream[32];
    if (e.stream == kNoStream) std::snprintf(stream, sizeof stream, "-");
    else std::snprintf(stream, sizeof stream, "0x%llx", static_cast<unsigned long long>(e.stream));
    std::fprintf(f_, "%llu,1,1,%d,%s,%s,0x%llx,%zu,%zu,%s,%d,%zu,%zu,%s\n",
                 static_cast<unsigned long long>(op_ * 1000), e.device, to_string(e.kind), stream,
                 static_cast<unsigned long long>(e.ptr), e.requested, e.rounded, trace_result_name(e.result),
                 e.cache_hit ? 1 : 0, e.allocated_after, e.reserved_after, e.async ? "async=1" : "");
  }

 private:
  std::FILE* f_;
  std::uint64_t op_ = 0;
};

// Peaks measured from the allocator's events (each carries the totals after it), forwarded to
// a trace writer if there is one. The events' totals are exact after every call; the peaks of
// MemoryStats are kept too (as stats_peak_*) to cross-check the core's own accounting.
class PeakObserver final : public AllocatorObserver {
 public:
  explicit PeakObserver(AllocatorObserver* next) : next_(next) {}
  void on_event(const AllocatorEvent& e) noexcept override {
    allocated = std::max(allocated, e.allocated_after);
    reserved = std::max(reserved, e.reserved_after);
    if (next_ != nullptr) next_->on_event(e);
  }
  std::size_t allocated = 0;
  std::size_t reserved = 0;

 private:
  AllocatorObserver* next_;
};

// --- one replay

struct ReplayResult {
  std::int64_t peak_allocated = 0;
  std::int64_t peak_reserved = 0;
  std::int64_t peak_requested = 0;
  std::int64_t peak_segments = 0;
  std::int64_t stats_peak_allocated = 0;  // MemoryStats' own peaks
  std::int64_t stats_peak_reserved = 0;
  std::int64_t device_allocs = 0;
  std::int64_t device_frees = 0;
  std::int64_t remaps = 0;          // page stitching: growths that moved free pages
  std::int64_t remapped_pages = 0;
  std::int64_t cache_hits = 0;
  std::int64_t cache_misses = 0;
  std::uint64_t ooms = 0;
  std::uint64_t skipped_frees = 0;   // frees of allocations that had failed
  std::uint64_t free_failures = 0;   // frees the allocator refused (should never happen)
  std::int64_t allocated_at_end = 0;
  std::int64_t reserved_at_end = 0;
  std::size_t limit = 0;
  bool completed = true;  // no OOM
  std::int64_t pending_waits = 0;  // fences a miss waited for (max_pending_mb; with --gpu-lag)
};

// The simulated device's timing and streams.
struct DeviceModel {
  // 0: the device keeps up (every fence has completed when the allocator looks); N: the program
  // runs N ops ahead of it: each op queues one item of work on its stream (cudaMalloc and
  // cudaFree: the legacy stream) and the device runs a stream only down to N queued items, or
  // further while the allocator waits on a fence. That is a GPU-bound program, whose frees wait.
  std::size_t gpu_lag = 0;
  // The program's streams all order with the legacy stream (no non-blocking stream, as in
  // PyTorch on one GPU): cudalloc's device fences then order reuse (SimOptions).
  bool blocking_streams = false;
};

ReplayResult replay(const Trace& t, const AllocatorOptions& options, std::size_t total, std::size_t limit,
                    bool stop_at_oom, const DeviceModel& model, OpTraceWriter* writer = nullptr) {
  const std::size_t gpu_lag = model.gpu_lag;
  SimBackend sim(SimOptions{.total_memory = total, .host_memory = false, .blocking_streams = model.blocking_streams});
  DeviceAllocator alloc(sim, options);
  if (limit != 0) alloc.set_memory_limit(limit);
  PeakObserver peaks(writer);
  alloc.set_observer(&peaks);
  ReplayResult r;
  r.limit = alloc.memory_limit();
  std::vector<DevicePtr> ptrs(t.slots, 0);
  std::vector<std::uint64_t> requested(t.slots, 0);
  std::uint64_t requested_now = 0, requested_peak = 0;
  std::uint64_t index = 0;
  for (const Op& op : t.ops) {
    if (writer != nullptr) writer->set_op(index++);
    if (gpu_lag != 0) {
      const StreamHandle work = op.stream == kNoStream ? 0 : op.stream;
      sim.enqueue(work);
      const std::size_t queued = sim.queued(work);
      if (queued > gpu_lag) sim.run(work, queued - gpu_lag);
    }
    if (op.kind == OpKind::kAlloc) {
      DevicePtr p = 0;
      const Status s = alloc.allocate(op.bytes, op.stream, &p, op.async);
      if (s == Status::kOk) {
        ptrs[op.slot] = p;
        requested[op.slot] = op.bytes;
        requested_now += op.bytes;
        requested_peak = std::max(requested_peak, requested_now);
      } else {
        ++r.ooms;
        r.completed = false;
        if (stop_at_oom) break;
      }
    } else {
      const DevicePtr p = ptrs[op.slot];
      if (p == 0) {
        ++r.skipped_frees;
        continue;
      }
      ptrs[op.slot] = 0;
      requested_now -= requested[op.slot];
      const FreeOrder order = op.stream == kNoStream ? FreeOrder::kDevice : FreeOrder::kStream;
      if (alloc.free(p, order, op.stream, op.async) != Status::kOk) ++r.free_failures;
    }
  }
  alloc.set_observer(nullptr);
  const MemoryStats st = alloc.stats();
  r.peak_allocated = static_cast<std::int64_t>(peaks.allocated);
  r.peak_reserved = static_cast<std::int64_t>(peaks.reserved);
  r.stats_peak_allocated = st.allocated_bytes[kStatAll].peak;
  r.stats_peak_reserved = st.reserved_bytes[kStatAll].peak;
  r.peak_requested = static_cast<std::int64_t>(requested_peak);
  r.peak_segments = st.segment[kStatAll].peak;
  r.device_allocs = st.num_device_alloc;
  r.device_frees = st.num_device_free;
  r.remaps = st.num_remaps;
  r.remapped_pages = st.num_remapped_pages;
  r.cache_hits = st.num_cache_hits;
  r.cache_misses = st.num_cache_misses;
  r.allocated_at_end = st.allocated_bytes[kStatAll].current;
  r.reserved_at_end = st.reserved_bytes[kStatAll].current;
  r.pending_waits = st.num_pending_waits;
  return r;
}

// --- minimum memory by bisection

struct MinMemory {
  std::optional<std::size_t> bytes;  // none: the trace does not complete even at the top limit
  std::size_t upper = 0;             // the largest limit tried
  int trials = 0;
};

MinMemory min_memory(const Trace& t, const AllocatorOptions& options, std::size_t total,
                     std::size_t top_limit, std::size_t resolution, const DeviceModel& model,
                     const ReplayResult& unlimited) {
  MinMemory m;
  auto ok = [&](std::size_t limit) {
    ++m.trials;
    return replay(t, options, total, limit, /*stop_at_oom=*/true, model).completed;
  };
  auto units_up = [&](std::size_t b) { return (b + resolution - 1) / resolution; };
  // Every limit below the peak allocated bytes fails: a run without OOM allocates exactly the
  // same rounded blocks as the unlimited one. lo is a known failure (in units), hi a success.
  std::uint64_t lo = unlimited.peak_allocated > 0 ? (std::uint64_t(unlimited.peak_allocated) - 1) / resolution : 0;
  const std::uint64_t top = top_limit / resolution;  // no limit above the configured one
  m.upper = top * resolution;
  // Trust but verify: if the lower bound completes after all (statistics that over-report the
  // peak), search from zero.
  if (lo != 0 && lo <= top && ok(lo * resolution)) lo = 0;
  std::uint64_t hi = std::max<std::uint64_t>(units_up(std::size_t(unlimited.peak_reserved)), lo + 1);
  if (hi > top) hi = top;
  while (!(hi > lo && ok(hi * resolution))) {
    if (hi >= top) return m;  // fails at the top: no limit works
    lo = std::max(lo, hi);
    hi = std::min(top, std::max(hi * 2, lo + 1));
  }
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (ok(mid * resolution)) hi = mid;
    else lo = mid;
  }
  m.bytes = hi * resolution;
  return m;
}

// --- output

struct Row {
  std::string setting;
  ReplayResult r;
  std::optional<MinMemory> min;
};

double utilization(const ReplayResult& r) {
  return r.peak_reserved > 0 ? double(r.peak_allocated) / double(r.peak_reserved) : 0.0;
}

// Segment allocations and frees (each map and unmap with expandable segments), and each growth
// that moved free pages (page stitching).
std::int64_t device_calls(const ReplayResult& r) { return r.device_allocs + r.device_frees + r.remaps; }
double hit_rate(const ReplayResult& r) {
  const auto n = r.cache_hits + r.cache_misses;
  return n > 0 ? double(r.cache_hits) / double(n) : 0.0;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += char(c); }
    else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); out += b; }
    else out += char(c);
  }
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) { if (c == '"') out += '"'; out += c; }
  return out + "\"";
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

struct Options {
  std::vector<std::string> confs;
  std::size_t limit = 0;
  std::size_t total = 80 * kGiB;
  std::size_t resolution = 2 * kMiB;
  bool min_memory = false;
  std::string format = "table";
  std::string input = "-";
  std::string label;
  std::string write_trace;
  DeviceModel device;
  bool as_cudamalloc = false;
};

void print_table(const Options& o, const Trace& t, const std::vector<Row>& rows) {
  std::printf("cudalloc replay of %s: %llu allocations, %llu frees", o.label.c_str(),
              (unsigned long long)t.allocs, (unsigned long long)t.frees);
  std::printf("; simulated device %s", format_bytes(o.total).c_str());
  if (o.limit != 0) std::printf(", limit %s", format_bytes(o.limit).c_str());
  if (o.as_cudamalloc) std::printf("; every op as cudaMalloc/cudaFree");
  if (o.device.gpu_lag != 0) std::printf("; device %zu ops behind", o.device.gpu_lag);
  if (o.device.blocking_streams) std::printf("; blocking streams only");
  std::printf("\n");
  if (t.errors != 0) {
    std::printf("input errors: %llu ops skipped (frees of ids not live, allocations of live ids; see stderr)\n",
                (unsigned long long)t.errors);
  }
  std::printf("\n");
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> head = {"setting", "peak allocated", "peak reserved", "utilization",
                                   "segments", "device calls", "OOMs", "cache hit rate"};
  if (o.min_memory) head.push_back("min memory");
  cells.push_back(head);
  for (const Row& row : rows) {
    std::vector<std::string> c = {row.setting,
                                  format_bytes(std::uint64_t(row.r.peak_allocated)),
                                  format_bytes(std::uint64_t(row.r.peak_reserved)),
                                  fmt("%.1f%%", 100.0 * utilization(row.r)),
                                  std::to_string(row.r.peak_segments),
                                  std::to_string(device_calls(row.r)),
                                  std::to_string(row.r.ooms),
                                  fmt("%.1f%%", 100.0 * hit_rate(row.r))};
    if (o.min_memory) {
      c.push_back(row.min && row.min->bytes ? format_bytes(*row.min->bytes)
                                            : "> " + format_bytes(row.min ? row.min->upper : 0));
    }
    cells.push_back(c);
  }
  std::vector<std::size_t> width(head.size(), 0);
  for (auto& c : cells) for (std::size_t i = 0; i < c.size(); ++i) width[i] = std::max(width[i], c[i].size());
  for (std::size_t r = 0; r < cells.size(); ++r) {
    std::string line;
    for (std::size_t i = 0; i < cells[r].size(); ++i) {
      const std::string& s = cells[r][i];
      if (i == 0) line += s + std::string(width[i] - s.size(), ' ');
      else line += "  " + std::string(width[i] - s.size(), ' ') + s;
    }
    std::printf("%s\n", line.c_str());
    if (r == 0) {
      std::size_t n = 0;
      for (auto w : width) n += w + 2;
      std::printf("%s\n", std::string(n - 2, '-').c_str());
    }
  }
  std::printf("\nutilization = peak allocated / peak reserved; segments = peak segment count; "
              "device calls = segment allocations + frees (+ page moves)\n");
  if (o.device.gpu_lag != 0) {
    std::printf("fence waits (a miss waiting for the device, max_pending_mb):");
    for (const Row& row : rows) std::printf(" %s %lld;", row.setting.c_str(), (long long)row.r.pending_waits);
    std::printf("\n");
  }
  if (o.min_memory) {
    std::printf("min memory = smallest limit (resolution %s) under which the whole trace completes without OOM\n",
                format_bytes(o.resolution).c_str());
  }
}

void print_json(const Options& o, const Trace& t, const std::vector<Row>& rows) {
  std::printf("{\n  \"input\": {\"source\": \"%s\", \"ops\": %llu, \"allocs\": %llu, \"frees\": %llu, "
              "\"input_errors\": %llu, \"total_memory\": %zu, \"limit\": %zu, \"resolution\": %zu, "
              "\"gpu_lag\": %zu, \"blocking_streams\": %s, \"as_cudamalloc\": %s},\n",
              json_escape(o.label).c_str(), (unsigned long long)t.ops.size(), (unsigned long long)t.allocs,
              (unsigned long long)t.frees, (unsigned long long)t.errors, o.total, o.limit, o.resolution,
              o.device.gpu_lag, o.device.blocking_streams ? "true" : "false", o.as_cudamalloc ? "true" : "false");
  std::printf("  \"results\": [\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const ReplayResult& r = row.r;
    std::printf("    {\"setting\": \"%s\", \"peak_allocated\": %lld, \"peak_reserved\": %lld, "
                "\"peak_requested\": %lld, \"utilization\": %.6f, \"segments\": %lld, \"device_calls\": %lld, "
                "\"device_allocs\": %lld, \"device_frees\": %lld, \"oom_events\": %llu, \"cache_hits\": %lld, "
                "\"cache_misses\": %lld, \"cache_hit_rate\": %.6f, \"skipped_frees\": %llu, "
                "\"allocated_at_end\": %lld, \"reserved_at_end\": %lld, \"limit\": %zu, "
                "\"stats_peak_allocated\": %lld, \"stats_peak_reserved\": %lld, \"pending_waits\": %lld, "
                "\"remaps\": %lld, \"remapped_pages\": %lld",
                json_escape(row.setting).c_str(), (long long)r.peak_allocated, (long long)r.peak_reserved,
                (long long)r.peak_requested, utilization(r), (long long)r.peak_segments,
                (long long)device_calls(r), (long long)r.device_allocs,
                (long long)r.device_frees, (unsigned long long)r.ooms, (long long)r.cache_hits,
                (long long)r.cache_misses, hit_rate(r), (unsigned long long)r.skipped_frees,
                (long long)r.allocated_at_end, (long long)r.reserved_at_end, r.limit,
                (long long)r.stats_peak_allocated, (long long)r.stats_peak_reserved, (long long)r.pending_waits,
                (long long)r.remaps, (long long)r.remapped_pages);
    if (row.min) {
      if (row.min->bytes) std::printf(", \"min_memory\": %zu", *row.min->bytes);
      else std::printf(", \"min_memory\": null");
      std::printf(", \"min_memory_trials\": %d", row.min->trials);
    }
    std::printf("}%s\n", i + 1 < rows.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

void print_csv(const Options& o, const std::vector<Row>& rows) {
  std::printf("setting,peak_allocated,peak_reserved,utilization,segments,device_calls,oom_events,cache_hit_rate");
  if (o.min_memory) std::printf(",min_memory");
  std::printf("\n");
  for (const Row& row : rows) {
    const ReplayResult& r = row.r;
    std::printf("%s,%lld,%lld,%.6f,%lld,%lld,%llu,%.6f", csv_field(row.setting).c_str(),
                (long long)r.peak_allocated, (long long)r.peak_reserved, utilization(r),
                (long long)r.peak_segments, (long long)device_calls(r),
                (unsigned long long)r.ooms, hit_rate(r));
    if (o.min_memory) {
      if (row.min && row.min->bytes) std::printf(",%zu", *row.min->bytes);
      else std::printf(",");
    }
    std::printf("\n");
  }
}

const char* kUsage =
    "usage: cudalloc-replay [options] [OPS_FILE|-]\n"
    "Replays a canonical op stream (see tools/README.md) through cudalloc's allocator on a\n"
    "simulated device and reports memory use per CUDALLOC_CONF setting.\n"
    "  --conf S           a CUDALLOC_CONF setting; repeatable, one result row each (default: defaults)\n"
    "  --limit SIZE       memory limit for the replay (bytes, or with KiB/MiB/GiB/TiB)\n"
    "  --total SIZE       simulated device memory (default 80GiB)\n"
    "  --min-memory       find by bisection the smallest limit under which the trace completes\n"
    "  --resolution SIZE  bisection resolution (default 2MiB)\n"
    "  --format F         table (default), json or csv\n"
    "  --label NAME       name of the input in the report\n"
    "  --write-trace FILE write a cudalloc trace (v1) of the first setting's replay to FILE\n"
    "  --gpu-lag N        the simulated device runs N ops behind the program (a GPU-bound program:\n"
    "                     freed blocks wait for it); default 0, every fence has completed\n"
    "  --as-cudamalloc    every allocation a cudaMalloc and every free a cudaFree (what a framework\n"
    "                     with its own cache off asks of cudalloc)\n"
    "  --blocking-streams the program has no non-blocking stream (PyTorch on one GPU): a device fence\n"
    "                     orders the reuse of the blocks it covers, so cudaFree'd blocks need not wait\n"
    "                     for the device\n"
    "  --print-config-table  print README's table of the CUDALLOC_CONF keys and exit\n";

Options parse_args(int argc, char** argv) {
  Options o;
  bool have_input = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      const auto eq = a.find('=');
      if (a.rfind("--", 0) == 0 && eq != std::string::npos) return a.substr(eq + 1);
      if (i + 1 >= argc) die("option " + a + " needs a value (see --help)");
      return argv[++i];
    };
    const std::string name = a.rfind("--", 0) == 0 ? a.substr(0, a.find('=')) : a;
    auto size_value = [&]() {
      const std::string v = value();
      auto s = parse_size(v);
      if (!s) die("bad size for " + name + ": " + quote(v) + " (bytes, or a number with KiB, MiB, GiB or TiB)");
      return *s;
    };
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (name == "--print-config-table") {
      std::fputs(config_table().c_str(), stdout);
      std::exit(0);
    } else if (name == "--conf") {
      o.confs.push_back(value());
    } else if (name == "--limit") {
      o.limit = size_value();
      if (o.limit == 0) die("--limit must be positive");
    } else if (name == "--total") {
      o.total = size_value();
      if (o.total == 0) die("--total must be positive");
    } else if (name == "--resolution") {
      o.resolution = size_value();
      if (o.resolution == 0) die("--resolution must be positive");
    } else if (name == "--min-memory") {
      o.min_memory = true;
    } else if (name == "--format") {
      o.format = value();
      if (o.format != "table" && o.format != "json" && o.format != "csv") {
        die("bad --format " + quote(o.format) + " (table, json or csv)");
      }
    } else if (name == "--label") {
      o.label = value();
    } else if (name == "--write-trace") {
      o.write_trace = value();
    } else if (name == "--gpu-lag") {
      const std::string v = value();
      std::size_t n = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size()) die("bad --gpu-lag " + quote(v) + " (a count of ops)");
      o.device.gpu_lag = n;
    } else if (name == "--blocking-streams") {
      o.device.blocking_streams = true;
    } else if (name == "--as-cudamalloc") {
      o.as_cudamalloc = true;
    } else if (a.size() > 1 && a[0] == '-') {
      die("unknown option " + quote(a) + " (see --help)");
    } else {
      if (have_input) die("more than one input given");
      o.input = a;
      have_input = true;
    }
  }
  if (o.label.empty()) o.label = o.input == "-" ? "stdin" : o.input;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const Options o = parse_args(argc, argv);

  // Settings first: a typo should not cost a read of a large trace.
  std::vector<std::pair<std::string, AllocatorOptions>> settings;
  if (o.confs.empty()) settings.emplace_back("(defaults)", AllocatorOptions{});
  for (const std::string& c : o.confs) {
    ConfigResult cr = parse_alloc_conf(c);
    if (!cr.config) die("bad --conf " + quote(c) + ": " + cr.error);
    settings.emplace_back(c.empty() ? "(defaults)" : c, cr.config->allocator);
  }

  Trace t;
  if (o.input == "-") {
    t = read_trace(std::cin, "stdin");
  } else {
    std::ifstream f(o.input);
    if (!f) die("cannot open " + o.input + ": " + std::strerror(errno));
    t = read_trace(f, o.input);
  }
  if (o.as_cudamalloc) {
    for (Op& op : t.ops) {
      op.stream = kNoStream;
      op.async = false;
    }
  }
  for (const auto& e : t.error_lines) std::fprintf(stderr, "%s: %s\n", kProg, e.c_str());
  if (t.errors > t.error_lines.size()) {
    std::fprintf(stderr, "%s: ... %llu more input errors\n", kProg,
                 (unsigned long long)(t.errors - t.error_lines.size()));
  }

  std::FILE* trace_out = nullptr;
  std::optional<OpTraceWriter> writer;
  if (!o.write_trace.empty()) {
    trace_out = std::fopen(o.write_trace.c_str(), "w");
    if (trace_out == nullptr) die("cannot write " + o.write_trace + ": " + std::strerror(errno));
    writer.emplace(trace_out);
  }

  std::vector<Row> rows;
  for (std::size_t i = 0; i < settings.size(); ++i) {
    const auto& [label, opts] = settings[i];
    Row row{label, replay(t, opts, o.total, o.limit, false, o.device, i == 0 && writer ? &*writer : nullptr),
            std::nullopt};
    if (o.min_memory) {
      // The top of the search: --limit if given, else the limit the setting itself implies.
      const std::size_t top = o.limit != 0 ? o.limit : replay(Trace{}, opts, o.total, 0, true, DeviceModel{}).limit;
      const ReplayResult base = o.limit != 0 ? replay(t, opts, o.total, 0, false, o.device) : row.r;
      row.min = min_memory(t, opts, o.total, std::min(top, o.total), o.resolution, o.device, base);
    }
    rows.push_back(std::move(row));
  }
  if (trace_out != nullptr && std::fclose(trace_out) != 0) die("cannot write " + o.write_trace);

  if (o.format == "json") print_json(o, t, rows);
  else if (o.format == "csv") print_csv(o, rows);
  else print_table(o, t, rows);
  return std::fflush(stdout) == 0 ? 0 : 2;
}
