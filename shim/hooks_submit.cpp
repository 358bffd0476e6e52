// The hooks of the driver calls that queue device work: each calls the driver, then notes the
// submission in the process's SubmissionWatch (allocator/submission_watch.h), which lets a
// cudaFree reuse its block at once when no work was queued since a passed fence.
//
// cuda.h declares each export under its own name, legacy and per-thread ones included, only
// with __CUDA_API_VERSION_INTERNAL: so this file alone is built that way, and takes each hook's
// exact type from the export's declaration. The exported symbol is a one-instruction jump to
// the typed hook (no argument is touched), so that programs linked with -lcuda bind to it.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

#include "allocator/submission_watch.h"
#include "shim/submissions.h"
#include "shim/submit_names.inc"
#include "support/real_dlsym.h"

namespace cudalloc::shim {

namespace {

enum Index : std::size_t {
#define CUDALLOC_INDEX(name) k_##name,
  CUDALLOC_SUBMISSIONS(CUDALLOC_INDEX)
#undef CUDALLOC_INDEX
  kCount
};

constexpr std::array<const char*, kCount> kNames = {
#define CUDALLOC_NAME(name) #name,
    CUDALLOC_SUBMISSIONS(CUDALLOC_NAME)
#undef CUDALLOC_NAME
};

constinit SubmissionWatch g_watch;

// The driver's exports, resolved all at once: the first lookup that needs them, or the first
// call of a hook (a program linked with -lcuda).
struct Reals {
  std::array<void*, kCount> fn{};
};
std::atomic<const Reals*> g_reals{nullptr};
std::mutex g_reals_mutex;

const Reals& reals() {
  if (const Reals* r = g_reals.load(std::memory_order_acquire)) return *r;
  std::lock_guard lock(g_reals_mutex);
  if (const Reals* r = g_reals.load(std::memory_order_acquire)) return *r;
  // The program's libcuda: loaded by now (a hook is called, or a lookup answered, only then).
  // Were it not, nothing is kept, so that a later call resolves them.
  static const Reals none;
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return none;
  auto* r = new Reals;
  const DlsymFn sym = real_dlsym();
  for (std::size_t i = 0; i < kCount; ++i) r->fn[i] = sym(handle, kNames[i]);
  g_reals.store(r, std::memory_order_release);
  return *r;
}

template <Index I, typename F>
struct Hook;

template <Index I, typename... A>
struct Hook<I, CUresult (*)(A...)> {
  static CUresult call(A... args) {
    auto real = reinterpret_cast<CUresult (*)(A...)>(reals().fn[I]);
    if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
    const CUresult r = real(args...);
    g_watch.note();
    return r;
  }
};

}  // namespace

// Read by the exported jumps below.
#define CUDALLOC_SLOT(name)                                                                       \
  extern "C" __attribute__((visibility("hidden"))) void* const cudalloc_submit_##name;          \
  extern "C" __attribute__((visibility("hidden"))) void* const cudalloc_submit_##name =         \
      reinterpret_cast<void*>(&Hook<k_##name, decltype(&::name)>::call);
CUDALLOC_SUBMISSIONS(CUDALLOC_SLOT)
#undef CUDALLOC_SLOT

namespace {
const std::array<void*, kCount> kHooks = {
#define CUDALLOC_HOOK(name) reinterpret_cast<void*>(&Hook<k_##name, decltype(&::name)>::call),
    CUDALLOC_SUBMISSIONS(CUDALLOC_HOOK)
#undef CUDALLOC_HOOK
};
}  // namespace

SubmissionWatch& submissions() { return g_watch; }

void* substitute_submission(void* real) {
  if (real == nullptr) return nullptr;
  const Reals& r = reals();
  for (std::size_t i = 0; i < kCount; ++i) {
    if (r.fn[i] == real) return kHooks[i];
  }
  return real;
}

bool is_submission_hook(const void* fn) {
  for (const void* h : kHooks) {
    if (h == fn) return true;
  }
  return false;
}

bool is_submission_hook_name(const char* symbol) {
  for (const char* n : kNames) {
    if (std::strcmp(n, symbol) == 0) return true;
  }
  return false;
}

bool is_submission_name(const char* symbol) {
  // Driver entry points are "cu" and a capital: not the runtime's cudaMemcpy, nor cuBLAS's.
  if (symbol == nullptr || std::strncmp(symbol, "cu", 2) != 0 || symbol[2] < 'A' || symbol[2] > 'Z') return false;
  if (std::strncmp(symbol, "cuGraph", 7) == 0) {
    // Building a graph queues nothing; launching or uploading one does.
    return std::strncmp(symbol, "cuGraphLaunch", 13) == 0 || std::strncmp(symbol, "cuGraphUpload", 13) == 0;
  }
  for (const char* part : {"Launch", "Memcpy", "Memset", "WaitValue", "WriteValue", "BatchMemOp", "Prefetch",
                           "Discard", "SemaphoresAsync", "MapArrayAsync", "Decompress"}) {
    if (std::strstr(symbol, part) != nullptr) return true;
  }
  return false;
}

}  // namespace cudalloc::shim

// The exported symbols: jumps to the typed hooks through their slots.
#define CUDALLOC_EXPORT_JUMP(name)                   \
  asm(".pushsection .text\n"                        \
      ".globl " #name "\n"                           \
      ".type " #name ", @function\n" #name ":\n"     \
      "  jmp *cudalloc_submit_" #name "(%rip)\n"     \
      ".size " #name ", . - " #name "\n"             \
      ".popsection\n");
CUDALLOC_SUBMISSIONS(CUDALLOC_EXPORT_JUMP)
#undef CUDALLOC_EXPORT_JUMP
