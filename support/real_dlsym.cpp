#include "support/real_dlsym.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace cudalloc::shim {

namespace {
// Built without sanitizers (dlsym_override.cpp): the builtins, not std::atomic, whose member
// functions may be instantiated in instrumented code too and kept from there by the linker.
DlsymFn g_real = nullptr;
}

DlsymFn real_dlsym() {
  DlsymFn f = __atomic_load_n(&g_real, __ATOMIC_ACQUIRE);
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
  __atomic_store_n(&g_real, f, __ATOMIC_RELEASE);
  return f;
}

}  // namespace cudalloc::shim
