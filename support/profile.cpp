#include "support/profile.h"

#include <stdlib.h>  // secure_getenv (glibc)

#include "allocator/types.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cudalloc::shim::profile {

namespace {

struct Counter {
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::int64_t> ns{0};
};
Counter g_counters[static_cast<int>(Site::kCount)];

const char* name(Site s) {
  static const char* const names[] = {"cuMemAlloc",    "cuMemFree",    "cuMemAllocAsync", "cuMemFreeAsync",
                                      "segment alloc", "segment free", "map",             "unmap",
                                      "fence record",  "fence query",  "fence wait",      "remap"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<int>(Site::kCount));
  return names[static_cast<int>(s)];
}

void print_at_exit() {
  std::fprintf(stderr, "cudalloc profile (time includes the timer's own cost per call):\n");
  for (int i = 0; i < static_cast<int>(Site::kCount); ++i) {
    const std::uint64_t calls = g_counters[i].calls.load();
    if (calls == 0) continue;
    const double ms = static_cast<double>(g_counters[i].ns.load()) / 1e6;
    std::fprintf(stderr, "  %-16s %12llu calls %12.3f ms %10.1f ns/call\n", name(static_cast<Site>(i)),
                 static_cast<unsigned long long>(calls), ms, ms * 1e6 / static_cast<double>(calls));
  }
}

}  // namespace

std::atomic<int> detail::g_enabled{-1};

bool detail::read_enabled() {
  // Once, whichever thread asks first (the static's guard), so atexit is registered once.
  static const bool on = [] {
    const char* v = ::secure_getenv("CUDALLOC_PROFILE");
    const bool set = v != nullptr && std::strcmp(v, "1") == 0;
    if (set) std::atexit(print_at_exit);
    return set;
  }();
  g_enabled.store(on ? 1 : 0, std::memory_order_relaxed);
  return on;
}

void add(Site site, std::int64_t ns) {
  Counter& c = g_counters[static_cast<int>(site)];
  c.calls.fetch_add(1, std::memory_order_relaxed);
  c.ns.fetch_add(ns, std::memory_order_relaxed);
}

}  // namespace cudalloc::shim::profile
