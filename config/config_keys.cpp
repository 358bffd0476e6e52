#include "config/config_keys.h"

#include <array>
#include <limits>

#include "allocator/size_classes.h"

namespace cudalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
// PyTorch's kLargeBuffer / 1 MiB: the smallest max_split_size_mb it accepts.
constexpr std::uint64_t kMinSplitSizeMb = 20;
constexpr std::uint64_t kMaxTraceStacks = 64;

// README's wording; the table there is this one's output (tests/structure checks it).
const std::array<ConfigKey, 17> kKeys = {{
    {.name = "max_split_size_mb",
     .kind = KeyKind::kMiB,
     .min = kMinSplitSizeMb,
     .range_note = " (20 MiB is PyTorch's minimum, its kLargeBuffer)",
     .size = [](Config& c) -> std::size_t& { return c.allocator.max_split_size; },
     .syntax = "`max_split_size_mb:N`",
     .default_text = "unlimited",
     .help = "blocks of N MiB or more are never split, and are released first under pressure (N >= 20)"},
    {.name = "garbage_collection_threshold",
     .kind = KeyKind::kFraction,
     .number = [](Config& c) -> double& { return c.allocator.garbage_collection_threshold; },
     .syntax = "`garbage_collection_threshold:F`",
     .default_text = "off",
     .help = "past F (0 < F < 1) of the memory limit, idle segments are released, oldest first, before new ones are made"},
    {.name = "roundup_power2_divisions",
     .kind = KeyKind::kDivisions,
     .syntax = "`roundup_power2_divisions:N` or `[256:1,512:2,>:4]`",
     .default_text = "off",
     .help = "round sizes to N steps between powers of two. The list form is read as PyTorch reads it: the first K:D covers K MiB's interval ([K, 2K) MiB) and every smaller size, each later K:D its own interval only, `>:D` every interval above the last key's; sizes in no interval are not rounded"},
    {.name = "expandable_segments",
     .kind = KeyKind::kBool,
     .flag = [](Config& c) -> bool& { return c.allocator.expandable_segments; },
     .syntax = "`expandable_segments:true`",
     .default_text = "false",
     .help = "grow segments in place on CUDA virtual memory (ignored, with a warning, on a device without virtual memory management)"},
    {.name = "per_process_memory_fraction",
     .kind = KeyKind::kFraction,
     .max_inclusive = true,
     .number = [](Config& c) -> double& { return c.allocator.per_process_memory_fraction; },
     .syntax = "`per_process_memory_fraction:F`",
     .default_text = "1",
     .help = "the process may reserve at most F (0 < F <= 1) of each device's memory, all its contexts on the device together"},
    // Below the smallest segment nothing could ever be served.
    {.name = "memory_limit_mb",
     .kind = KeyKind::kMiB,
     .min = kSmallBuffer / kMiB,
     .range_note = " (the smallest segment is 2 MiB)",
     .size = [](Config& c) -> std::size_t& { return c.allocator.memory_limit_bytes; },
     .syntax = "`memory_limit_mb:N`",
     .default_text = "none",
     .help = "the process may reserve at most N MiB on each device, all its contexts on the device together"},
    {.name = "free_sync",
     .kind = KeyKind::kBool,
     .flag = [](Config& c) -> bool& { return c.free_sync; },
     .syntax = "`free_sync:true`",
     .default_text = "false",
     .help = "`cudaFree` blocks the host like the native one (for programs that use it as a barrier)"},
    {.name = "watch_submissions",
     .kind = KeyKind::kBool,
     .flag = [](Config& c) -> bool& { return c.watch_submissions; },
     .syntax = "`watch_submissions:false`",
     .default_text = "true",
     .help = "a `cudaFree`'d block is reused at once while the program has queued no device work (kernels, copies, sets) since a device fence that has passed; false: it always waits for a fence of its own"},
    {.name = "trace_stacks",
     .kind = KeyKind::kCount,
     .max = kMaxTraceStacks,
     .size = [](Config& c) -> std::size_t& { return c.trace_stacks; },
     .syntax = "`trace_stacks:N`",
     .default_text = "0",
     .help = "record N native stack frames per trace record"},
    {.name = "trace_nvtx",
     .kind = KeyKind::kBool,
     .flag = [](Config& c) -> bool& { return c.trace_nvtx; },
     .syntax = "`trace_nvtx:true`",
     .default_text = "false",
     .help = "with `CUDALLOC_TRACE`: record the calling thread's NVTX range stack per trace record (cudalloc becomes the program's NVTX injection; see Traces)"},
    {.name = "trace_clock",
     .kind = KeyKind::kChoice,
     .choices = {"tsc", "monotonic"},
     .flag = [](Config& c) -> bool& { return c.trace_tsc; },
     .syntax = "`trace_clock:monotonic`",
     .default_text = "tsc",
     .help = "stamp trace records with `clock_gettime` instead of the TSC (`tsc`: the TSC where the kernel's clocksource is the TSC; docs/trace-format.md)"},
    {.name = "free_epoch_mb",
     .kind = KeyKind::kMiB,
     .size = [](Config& c) -> std::size_t& { return c.allocator.free_epoch_bytes; },
     .syntax = "`free_epoch_mb:N`",
     .default_text = "64",
     .help = "cudaFree'd memory is fenced once N MiB of it wait (0 fences at every miss): a larger N shares one device fence among more frees, at the cost of up to N MiB more reserved"},
    {.name = "thread_cache",
     .kind = KeyKind::kBool,
     .flag = [](Config& c) -> bool& { return c.allocator.thread_cache; },
     .syntax = "`thread_cache:false`",
     .default_text = "true",
     .help = "turn off the per-thread caches"},
    {.name = "max_pending_mb",
     .kind = KeyKind::kMiB,
     .size = [](Config& c) -> std::size_t& { return c.allocator.max_pending_bytes; },
     .syntax = "`max_pending_mb:N`",
     .default_text = "1024",
     .help = "cudaFree'd memory that may wait on device fences before a miss waits for the oldest fence instead of cutting new memory (0 = no bound): it bounds how far a program that runs ahead of the GPU can grow the cache"},
    {.name = "single_stream",
     .kind = KeyKind::kBool,
     .flag = [](Config& c) -> bool& { return c.single_stream; },
     .syntax = "`single_stream:true`",
     .default_text = "false",
     .help = "the program runs all its device work on the legacy default stream (PyTorch does; see below): a `cudaFree`'d block is reused at once, in that stream's order, instead of after a device fence"},
    {.name = "page_stitching",
     .kind = KeyKind::kBool,
     .flag = [](Config& c) -> bool& { return c.allocator.page_stitching; },
     .syntax = "`page_stitching:true`",
     .default_text = "false",
     .help = "expandable segments whose reserved memory follows live memory page by page: a growth moves the free 2 MiB pages of other blocks (any stream, either pool) to where it is needed before it makes new memory, so only partial pages at the edges of live blocks stay as waste. A page moves only after the device is done with it. Less memory than PyTorch's expandable segments, at a cost in driver calls at each growth (docs/fragmentation.md has both), so it is not the default. Implies `expandable_segments:true`"},
    {.name = "pinned_memory_limit_mb",
     .kind = KeyKind::kMiB,
     .min = 1,
     .size = [](Config& c) -> std::size_t& { return c.allocator.pinned_memory_limit_bytes; },
     .syntax = "`pinned_memory_limit_mb:N`",
     .default_text = "none",
     .help = "the pinned host memory (`cudaHostAlloc`, `cudaMallocHost`) that the caches of all the process's contexts may hold together, in use and cached, is at most N MiB (N >= 1)"},
}};

}  // namespace

std::span<const ConfigKey> config_keys() { return kKeys; }

std::string accepted_keys() {
  std::string out;
  for (const ConfigKey& k : kKeys) {
    if (!out.empty()) out += ", ";
    out += k.name;
  }
  return out;
}

std::string config_table() {
  std::string out = "| key | default | meaning |\n| --- | --- | --- |\n";
  for (const ConfigKey& k : kKeys) {
    out += "| ";
    out += k.syntax;
    out += " | ";
    out += k.default_text;
    out += " | ";
    out += k.help;
    out += " |\n";
  }
  return out;
}

}  // namespace cudalloc
