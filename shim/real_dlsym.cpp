#include "shim/real_dlsym.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace cudalloc::shim {

namespace {
std::atomic<DlsymFn> g_real{nullptr};
}

DlsymFn real_dlsym() {
  DlsymFn f = g_real.load(std::memory_order_acquire);
  if (f != nullptr) return f;
  // dlvsym is not overridden, so asking it for "the next dlsym" cannot come back to us.
  // Racing threads all find the same pointer; storing it twice is harmless.
  void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (p == nullptr) {
    std::fputs("cudalloc: cannot find the C library's dlsym\n", stderr);
    std::abort();
  }
  f = reinterpret_cast<DlsymFn>(p);
  g_real.store(f, std::memory_order_release);
  return f;
}

}  // namespace cudalloc::shim
