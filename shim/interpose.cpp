// How programs reach the hooks: every runtime (static or shared) and most libraries get
// driver entry points through dlsym on the libcuda handle and cuGetProcAddress(_v2); we
// override dlsym and wrap cuGetProcAddress, and hand out our hook wherever the driver's
// answer is the exact export we wrap. Programs linked with -lcuda bind to our exports.
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

#include "shim/hooks.h"
#include "shim/runtime.h"
#include "shim/submissions.h"
#include "allocator/submission_watch.h"
#include "support/log.h"
#include "support/real_dlsym.h"

namespace cudalloc::shim {

namespace {

struct Pair {
  void* real;
  void* hook;
};

#define CUDALLOC_COUNT(name) +1
constexpr std::size_t kHooks = 0 CUDALLOC_HOOKS(CUDALLOC_COUNT);
#undef CUDALLOC_COUNT

constexpr std::array<const char*, kHooks> kNames = {
#define CUDALLOC_NAME(name) #name,
    CUDALLOC_HOOKS(CUDALLOC_NAME)
#undef CUDALLOC_NAME
};

std::atomic<const std::array<Pair, kHooks>*> g_pairs{nullptr};
std::mutex g_pairs_mutex;

// By identity: the same base name is asked for at several versions and flags, and the driver
// answers each with one exact export (cuMemAllocAsync_ptsz, cuMemFree_v2, ...).
const std::array<Pair, kHooks>* pairs(const DriverApi& d) {
  if (auto* p = g_pairs.load(std::memory_order_acquire)) return p;
  std::lock_guard lock(g_pairs_mutex);
  if (auto* p = g_pairs.load(std::memory_order_acquire)) return p;
  auto* table = new std::array<Pair, kHooks>{{
#define CUDALLOC_PAIR(name) Pair{reinterpret_cast<void*>(d.name), reinterpret_cast<void*>(&::name)},
      CUDALLOC_HOOKS(CUDALLOC_PAIR)
#undef CUDALLOC_PAIR
  }};
  g_pairs.store(table, std::memory_order_release);
  return table;
}

void* substitute_with(const DriverApi& d, void* real) {
  if (real == nullptr) return real;
  for (const Pair& p : *pairs(d)) {
    if (p.real == real) return p.hook;
  }
  return substitute_submission(real);
}

// A lookup answered with `real` (null: not found), replaced by a hook of ours or not.
void watch_lookup(const char* symbol, const void* real, bool hooked) {
  if (real == nullptr || hooked || !is_submission_name(symbol) || is_submission_hook(real)) return;
  // An entry point that queues device work, and no hook of ours: work queued through it would
  // go unseen, so no cudaFree'd block may count on the watch from now on.
  if (!submissions().blind()) {
    submissions().go_blind();
    log_info("%s queues device work and is not watched: cudaFree'd blocks wait for device fences from now on",
             symbol);
  }
}

}  // namespace

void* substitute(void* real) { return substitute_with(driver(), real); }

namespace {
// At CUDALLOC_LOG_LEVEL=debug, every driver lookup a program makes and whether it met a hook:
// the way to see why a program's allocations are not served.
void log_lookup(const char* how, const char* symbol, int version, cuuint64_t flags, void* real, void* given) {
  log_debug("%s %s (version %d, flags %llu): %s", how, symbol == nullptr ? "(null)" : symbol, version,
            static_cast<unsigned long long>(flags), real == nullptr ? "not found" : given != real ? "hooked" : "passed");
}
}  // namespace

void* answer_lookup_if_loaded(const char* symbol, void* real) {
  if (real == nullptr) return real;
  // Only once libcuda is loaded: a lookup in some other library must not load the driver.
  const DriverApi* d = driver_if_loaded();
  if (d == nullptr) return real;
  void* given = substitute_with(*d, real);
  watch_lookup(symbol, real, given != real);
  return given;
}

void watch_global_lookup(const char* symbol, bool next) {
  if (!is_submission_name(symbol) || driver_if_loaded() == nullptr) return;
  // RTLD_DEFAULT finds our hook first for a name we wrap; RTLD_NEXT from a library loaded
  // after this one finds the driver's, which we would not see.
  if (!next && is_submission_hook_name(symbol)) return;
  watch_lookup(symbol, symbol, /*hooked=*/false);
}

bool is_hooked_name(const char* symbol) {
  if (symbol == nullptr || symbol[0] != 'c' || symbol[1] != 'u') return false;
  for (const char* n : kNames) {
    if (std::strcmp(n, symbol) == 0) return true;
  }
  return is_submission_name(symbol);
}

}  // namespace cudalloc::shim

using namespace cudalloc::shim;

CUDALLOC_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* status) {
  runtime();  // the first CUDA call: a bad configuration exits here, before any CUDA work
  const DriverApi& d = driver();
  if (d.cuGetProcAddress_v2 == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = d.cuGetProcAddress_v2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn != nullptr) {
    void* real = *pfn;
    *pfn = substitute_with(d, real);
    watch_lookup(symbol, real, *pfn != real);
    log_lookup("cuGetProcAddress_v2", symbol, version, flags, real, *pfn);
  }
  return r;
}

CUDALLOC_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  runtime();
  const DriverApi& d = driver();
  if (d.cuGetProcAddress == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = d.cuGetProcAddress(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr) {
    void* real = *pfn;
    *pfn = substitute_with(d, real);
    watch_lookup(symbol, real, *pfn != real);
    log_lookup("cuGetProcAddress", symbol, version, flags, real, *pfn);
  }
  return r;
}
