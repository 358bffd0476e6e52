// libFuzzer target: the allocator core (DeviceAllocator on SimBackend), driven by the input
// bytes and checked against a plain model after every step. Any violation calls abort().
//
// Input layout (a reader that runs out returns zeros, so every input is valid):
//   byte 0  options: bit0 expandable_segments, bit1 thread_cache, bits2-3 max_split_size
//           (none / 20 MiB / 40 MiB / 100 MiB), bit4 garbage_collection_threshold 0.5,
//           bit5 a memory limit, bit6 roundup_power2_divisions 4, bit7 host memory behind
//           pointers (then each block's first and last bytes carry its id and are checked)
//   byte 1  device size: 64 MiB + byte * 8 MiB; its bit0, with expandable_segments, turns on
//           page_stitching
//   then ops, one opcode byte each followed by its operands (see the switch below).
//
// Checked after every step: live blocks are 512-aligned and never overlap; find() describes
// each live block exactly; allocated/requested/count statistics equal the model's sums;
// reserved bytes equal the simulated device's used bytes; reserved never grows past the
// limit (unless it already was above a lowered limit); results are kOk or kOutOfMemory (or
// kBackendError only right after an injected non-allocation fault); a freed pointer is
// refused a second time. At the end every block is freed, everything is released, and the
// device holds nothing.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"
#include "allocator/size_classes.h"

using namespace cudalloc;

namespace {

#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "fuzz_allocator: violated at step %zu: %s (%s:%d)\n", g_step, \
                   #cond, __FILE__, __LINE__);                                           \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

std::size_t g_step = 0;
// FUZZ_ALLOCATOR_VERBOSE=1 prints every step (for reproducing a crash by hand).
const bool g_verbose = std::getenv("FUZZ_ALLOCATOR_VERBOSE") != nullptr;
#define VLOG(...)                                      \
  do {                                                 \
    if (g_verbose) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

struct Reader {
  const std::uint8_t* p;
  std::size_t n;
  std::size_t i = 0;
  bool done() const { return i >= n; }
  std::uint8_t u8() { return i < n ? p[i++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
};

constexpr StreamHandle kStreams[] = {kNoStream, 0, 0x100, 0x200, 0x300};
constexpr std::size_t kNumStreams = sizeof kStreams / sizeof kStreams[0];

struct Live {
  DevicePtr ptr;
  std::size_t requested;
  std::size_t size;
  StreamHandle stream;
  std::uint64_t id;
};

// Sizes: mostly small, sometimes large, now and then huge (must fail cleanly).
std::size_t pick_size(Reader& r) {
  const std::uint8_t kind = r.u8();
  const std::uint16_t v = r.u16();
  switch (kind % 8) {
    case 0: case 1: case 2: return 1 + v % 4096;                      // < 4 KiB
    case 3: case 4: return 1 + (std::size_t{v} << 5);                 // < 2 MiB
    case 5: return 1 + (std::size_t{v} << 9);                         // < 32 MiB
    case 6: return (std::size_t{1} << 20) * (1 + v % 128) - (v & 1);  // MiB multiples +-1
    default:
      switch (v % 4) {
        case 0: return SIZE_MAX;
        case 1: return std::size_t{1} << 62;
        case 2: return SIZE_MAX - 511;
        default: return 0;  // kInvalidValue
      }
  }
}

struct Harness {
  AllocatorOptions options;
  SimBackend sim;
  DeviceAllocator alloc;
  bool host_memory;
  std::map<DevicePtr, Live> live;  // by address
  std::uint64_t next_id = 1;
  StreamHandle current = 0;
  std::int64_t ooms = 0;
  bool backend_fault_pending = false;
  bool stalled = false;

  Harness(const AllocatorOptions& o, const SimOptions& so)
      : options(o), sim(so), alloc(sim, o), host_memory(so.host_memory) {}

  void stamp(const Live& l) {
    if (!host_memory) return;
    auto* first = reinterpret_cast<std::uint64_t*>(l.ptr);
    *first = l.id;
    if (l.requested >= 16) std::memcpy(reinterpret_cast<void*>(l.ptr + l.requested - 8), &l.id, 8);
  }
  void verify(const Live& l) {
    if (!host_memory) return;
    VLOG("%zu: verify 0x%zx (%zu B requested, %zu B block)\n", g_step, static_cast<std::size_t>(l.ptr), l.requested,
         l.size);
    // SimBackend::is_accessible looks at one segment or one map() call's range: a block of an
    // expandable segment that spans several map() calls is checked granule by granule.
    const std::size_t g = sim.vm_granularity();
    for (DevicePtr a = l.ptr; a < l.ptr + l.requested;) {
      const DevicePtr end = std::min<DevicePtr>(l.ptr + l.requested, (a / g + 1) * g);
      FUZZ_CHECK(sim.is_accessible(a, end - a));
      a = end;
    }
    FUZZ_CHECK(*reinterpret_cast<std::uint64_t*>(l.ptr) == l.id);
    if (l.requested >= 16) {
      std::uint64_t tail = 0;
      std::memcpy(&tail, reinterpret_cast<void*>(l.ptr + l.requested - 8), 8);
      FUZZ_CHECK(tail == l.id);
    }
  }

  void check(std::size_t ceiling) {
    const MemoryStats st = alloc.stats();
    std::int64_t allocated = 0, requested = 0;
    DevicePtr previous_end = 0;
    for (const auto& [ptr, l] : live) {
      FUZZ_CHECK(ptr % kMinBlockSize == 0);
      FUZZ_CHECK(l.size >= l.requested);
      FUZZ_CHECK(ptr >= previous_end);
      previous_end = ptr + l.size;
      allocated += static_cast<std::int64_t>(l.size);
      requested += static_cast<std::int64_t>(l.requested);
    }
    const std::size_t all = kStatAll, small = stat_index(PoolKind::kSmall), large = stat_index(PoolKind::kLarge);
    FUZZ_CHECK(st.allocated_bytes[all].current == allocated);
    FUZZ_CHECK(st.requested_bytes[all].current == requested);
    FUZZ_CHECK(st.allocation[all].current == static_cast<std::int64_t>(live.size()));
    const std::int64_t reserved = st.reserved_bytes[all].current;
    FUZZ_CHECK(reserved >= 0);
    FUZZ_CHECK(reserved == static_cast<std::int64_t>(sim.used_bytes()));
    FUZZ_CHECK(static_cast<std::size_t>(reserved) <= ceiling);
    FUZZ_CHECK(st.active_bytes[all].current >= allocated);
    FUZZ_CHECK(st.active_bytes[all].current + st.inactive_split_bytes[all].current <= reserved);
    FUZZ_CHECK(st.reserved_bytes[small].current + st.reserved_bytes[large].current == reserved);
    FUZZ_CHECK(st.allocated_bytes[all].peak >= allocated && st.reserved_bytes[all].peak >= reserved);
    FUZZ_CHECK(alloc.cached_bytes() == static_cast<std::size_t>(reserved - allocated));
  }

  void do_allocate(std::size_t bytes, bool async) {
    DevicePtr p = 0xdead;
    const Status st = alloc.allocate(bytes, current, &p, async);
    VLOG("%zu: allocate %zu on 0x%zx%s -> %s 0x%zx\n", g_step, bytes, static_cast<std::size_t>(current),
         async ? " async" : "", to_string(st), static_cast<std::size_t>(p));
    if (bytes == 0) {
      FUZZ_CHECK(st == Status::kInvalidValue);
      return;
    }
    if (st == Status::kOk) {
      FUZZ_CHECK(p != 0);
      FUZZ_CHECK(live.count(p) == 0);
      const auto info = alloc.find(p);
      FUZZ_CHECK(info.has_value());
      FUZZ_CHECK(info->base == p);
      FUZZ_CHECK(info->requested == bytes);
      FUZZ_CHECK(info->size >= SizeClasses(options).round(bytes));
      FUZZ_CHECK(info->stream == current);
      FUZZ_CHECK(alloc.owns(p));
      Live l{p, bytes, info->size, current, next_id++};
      live.emplace(p, l);
      stamp(l);
      return;
    }
    FUZZ_CHECK(p == 0);
    if (st == Status::kBackendError) {
      // A device refusal that is not for want of memory ends the ladder: no OOM is counted.
      FUZZ_CHECK(backend_fault_pending);
      return;
    }
    FUZZ_CHECK(st == Status::kOutOfMemory);
    ++ooms;
  }

  void do_free(Reader& r) {
    if (live.empty()) return;
    auto it = std::next(live.begin(), static_cast<long>(r.u8() % live.size()));
    const Live l = it->second;
    verify(l);
    const std::uint8_t how = r.u8();
    Status st = Status::kOk;
    const StreamHandle other = kStreams[1 + how / 8 % (kNumStreams - 1)];
    switch (how % 6) {
      case 0: st = alloc.free(l.ptr, FreeOrder::kDevice); break;
      case 1: st = alloc.free(l.ptr, FreeOrder::kCompleted); break;
      case 2: st = alloc.free(l.ptr, FreeOrder::kStream, l.stream == kNoStream ? 0 : l.stream, true); break;
      case 3: st = alloc.free(l.ptr, FreeOrder::kStream, other, true); break;  // async free elsewhere
      case 4: {  // a cudaFree from another thread (its own thread cache, which then exits)
        std::thread t([&] { st = alloc.free(l.ptr, FreeOrder::kDevice); });
        t.join();
        break;
      }
      case 5: st = alloc.free(l.ptr, FreeOrder::kStream, other, false); break;
    }
    VLOG("%zu: free 0x%zx (%zu B, stream 0x%zx) how %u other 0x%zx -> %s\n", g_step,
         static_cast<std::size_t>(l.ptr), l.size, static_cast<std::size_t>(l.stream), how % 6,
         static_cast<std::size_t>(other), to_string(st));
    FUZZ_CHECK(st == Status::kOk);
    live.erase(it);
    FUZZ_CHECK(alloc.free(l.ptr, FreeOrder::kDevice) == Status::kInvalidValue);  // double free
    FUZZ_CHECK(!alloc.find(l.ptr).has_value());
  }

  void run(Reader& r) {
    while (!r.done() && g_step < 4096) {
      ++g_step;
      const std::size_t reserved_before = sim.used_bytes();
      const std::uint8_t op = r.u8();
      bool fault_this_step = false;
      VLOG("%zu: op %u\n", g_step, op % 16);
      switch (op % 16) {
        case 0: case 1: case 2: case 3: do_allocate(pick_size(r), false); break;
        case 4: do_allocate(pick_size(r), true); break;
        case 5: case 6: case 7: do_free(r); break;
        case 8: current = kStreams[r.u8() % kNumStreams]; break;  // stream switch
        case 9: sim.enqueue(kStreams[1 + r.u8() % (kNumStreams - 1)]); break;
        case 10: sim.run(kStreams[1 + r.u8() % (kNumStreams - 1)], r.u8() % 4); break;
        case 11: {
          const std::uint8_t v = r.u8();
          alloc.set_memory_limit(v < 64 ? 0 : std::size_t{v} * kMiB);
          break;
        }
        case 12: alloc.release_cached(); break;
        case 13: {  // injected backend failure
          const std::uint8_t v = r.u8();
          static constexpr SimOp kOps[] = {SimOp::kAllocate, SimOp::kMap, SimOp::kReserve, SimOp::kUnmap};
          const SimOp which = kOps[v % 4];
          sim.fail_after(which, v / 4 % 4);
          VLOG("%zu: fail_after op %d in %d\n", g_step, static_cast<int>(which), v / 4 % 4);
          if (which != SimOp::kAllocate && which != SimOp::kMap) backend_fault_pending = true;
          fault_this_step = true;
          break;
        }
        case 14: {
          const std::uint8_t v = r.u8();
          if (v % 4 == 0) {
            stalled = !stalled;
            sim.set_fences_stall(stalled);
          } else if (v % 4 == 1) {
            sim.run_all();
          } else if (!live.empty()) {  // interior pointer and record_stream
            const Live& l = std::next(live.begin(), static_cast<long>(v % live.size()))->second;
            if (l.size > kMinBlockSize) {
              FUZZ_CHECK(alloc.free(l.ptr + kMinBlockSize, FreeOrder::kDevice) == Status::kInvalidValue);
              const auto info = alloc.find(l.ptr + kMinBlockSize);
              FUZZ_CHECK(info.has_value() && info->base == l.ptr);
            }
            if (l.stream != kNoStream) {
              FUZZ_CHECK(alloc.record_stream(l.ptr, kStreams[1 + v / 4 % (kNumStreams - 1)]) == Status::kOk);
            }
          }
          break;
        }
        case 15: {  // a random address: refused, nothing changes
          const DevicePtr p = (static_cast<DevicePtr>(r.u16()) << 9) | (DevicePtr{1} << 40);
          if (live.count(p) == 0) FUZZ_CHECK(alloc.free(p, FreeOrder::kDevice) == Status::kInvalidValue);
          alloc.synchronize_pending();
          break;
        }
      }
      (void)fault_this_step;
      VLOG("%zu: reserved %zu (before %zu) limit %zu\n", g_step, sim.used_bytes(), reserved_before,
           alloc.memory_limit());
      check(std::max(alloc.memory_limit(), reserved_before));
    }
    // Teardown: clear faults, free everything, release, nothing left.
    sim.set_fences_stall(false);
    for (const auto& [ptr, l] : live) {
      verify(l);
      FUZZ_CHECK(alloc.free(ptr, FreeOrder::kDevice) == Status::kOk);
    }
    live.clear();
    alloc.set_memory_limit(0);
    alloc.release_cached();
    // A one-shot unmap/free fault still armed may keep one chunk back; a second release must
    // give it back.
    if (sim.used_bytes() != 0) alloc.release_cached();
    check(std::max(alloc.memory_limit(), sim.used_bytes()));
    FUZZ_CHECK(alloc.stats().num_ooms == ooms);
    FUZZ_CHECK(alloc.stats().reserved_bytes[kStatAll].current == 0);
    FUZZ_CHECK(sim.used_bytes() == 0);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader r{data, size};
  const std::uint8_t flags = r.u8();
  AllocatorOptions o;
  o.expandable_segments = (flags & 1) != 0;
  o.thread_cache = (flags & 2) != 0;
  static constexpr std::size_t kSplit[] = {SIZE_MAX, 20 * kMiB, 40 * kMiB, 100 * kMiB};
  o.max_split_size = kSplit[(flags >> 2) & 3];
  if (flags & 16) o.garbage_collection_threshold = 0.5;
  if (flags & 32) o.memory_limit_bytes = 96 * kMiB;
  if (flags & 64) o.roundup_power2_divisions.fill(4);
  SimOptions so;
  so.host_memory = (flags & 128) != 0;
  const std::uint8_t size_byte = r.u8();
  so.total_memory = 64 * kMiB + std::size_t{size_byte} * 8 * kMiB;
  o.page_stitching = o.expandable_segments && (size_byte & 1) != 0;
  g_step = 0;
  Harness h(o, so);
  h.run(r);
  return 0;
}
