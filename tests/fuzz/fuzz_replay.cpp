// libFuzzer target: cudalloc-replay's input handling (tools/cudalloc_replay.cpp), unmodified.
//
// The tool is compiled into this file with its main() renamed and std::exit() turned into an
// exception, so its own functions run in-process: read_trace() on the op stream, replay() and
// min_memory() on what it accepted, parse_size() and parse_args() on option text.
//
// Input: the first line (up to '\n') is split on blanks into command-line arguments for
// parse_args(); the rest is the op stream. Checked: no crash or sanitizer report; a bad input
// ends in the tool's exit(2) (never an abort or an unbounded allocation); an accepted trace
// replays with no refused free, consistent totals, and min_memory() terminates.
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

namespace std {
struct replay_exit {
  int code;
};
[[noreturn]] inline void replay_exit_hook(int code) { throw replay_exit{code}; }
}  // namespace std

#define main cudalloc_replay_main
#define exit replay_exit_hook
#include "tools/cudalloc_replay.cpp"
#undef exit
#undef main

namespace {

[[noreturn]] void violation(const char* what) {
  std::fprintf(stderr, "fuzz_replay: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  const std::size_t nl = all.find('\n');
  std::string_view args_line = nl == std::string_view::npos ? all : all.substr(0, nl);
  std::string_view body = nl == std::string_view::npos ? std::string_view() : all.substr(nl + 1);

  // Command line: parse_args() (its --help path prints and exits 0; the output is dropped).
  std::vector<std::string> words{"cudalloc-replay"};
  {
    std::string_view rest = args_line;
    for (std::string_view w = next_field(rest); !w.empty() && words.size() < 16; w = next_field(rest)) {
      words.emplace_back(w);
      // Sizes go through parse_size() directly too.
      (void)parse_size(w);
    }
  }
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  try {
    std::FILE* saved = stdout;
    stdout = std::fopen("/dev/null", "w");
    try {
      (void)parse_args(static_cast<int>(words.size()), argv.data());
    } catch (...) {
      std::fclose(stdout);
      stdout = saved;
      throw;
    }
    std::fclose(stdout);
    stdout = saved;
  } catch (const std::replay_exit& e) {
    if (e.code != 0 && e.code != 2) violation("parse_args exited with a status other than 0 or 2");
  }

  // The op stream.
  Trace t;
  try {
    std::istringstream in{std::string(body)};
    t = read_trace(in, "fuzz");
  } catch (const std::replay_exit& e) {
    if (e.code != 2) violation("read_trace exited with a status other than 2");
    return 0;
  }
  if (t.allocs + t.frees + t.errors == 0 && !t.ops.empty()) violation("ops without counts");
  if (t.ops.size() > 4000) return 0;  // keep each input fast

  const std::size_t total = 1 * kGiB;
  const ReplayResult r = replay(t, AllocatorOptions{}, total, 0, false, DeviceModel{});
  if (r.free_failures != 0) violation("the allocator refused a free of a live allocation");
  if (r.allocated_at_end < 0 || r.reserved_at_end < r.allocated_at_end) violation("end totals inconsistent");
  if (r.peak_allocated > r.peak_reserved) violation("peak allocated above peak reserved");
  if (r.stats_peak_allocated != r.peak_allocated) violation("stats peak differs from the event peak");
  if (t.ops.size() <= 200) {
    AllocatorOptions expandable;
    expandable.expandable_segments = true;
    const ReplayResult re = replay(t, expandable, total, 0, false, DeviceModel{});
    if (re.free_failures != 0) violation("free refused (expandable)");
    // The device behind the program: frees wait, nothing else may change. With blocking streams
    // only, fences order reuse: the same replay as a device that keeps up.
    const DeviceModel behind{.gpu_lag = 1 + t.ops.size() % 50};
    const ReplayResult rl = replay(t, AllocatorOptions{}, total, 0, false, behind);
    if (rl.free_failures != 0) violation("free refused (device behind)");
    if (rl.peak_allocated > rl.peak_reserved) violation("peak allocated above peak reserved (device behind)");
    const ReplayResult rb =
        replay(t, AllocatorOptions{}, total, 0, false, DeviceModel{.gpu_lag = behind.gpu_lag, .blocking_streams = true});
    if (rb.free_failures != 0) violation("free refused (device behind, blocking streams)");
    if (rb.peak_allocated > rb.peak_reserved) violation("peak allocated above peak reserved (blocking streams)");
    const MinMemory m = min_memory(t, AllocatorOptions{}, total, total, 2 * kMiB, DeviceModel{}, r);
    if (m.bytes && r.completed && *m.bytes > total) violation("min memory above the device");
  }
  return 0;
}
