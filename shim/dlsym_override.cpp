// The dlsym override. This file and real_dlsym.cpp are built without sanitizer instrumentation
// (shim/meson.build): a sanitizer runtime calls dlsym(RTLD_NEXT, ...) while it initialises,
// before its shadow memory exists, and instrumented code on that path crashes every process.
// Everything the special handles reach is here or in the C library.
#include <dlfcn.h>

#include "driver/cuda_api.h"
#include "shim/hooks.h"
#include "support/real_dlsym.h"

using namespace cudalloc::shim;

// RTLD_NEXT (and RTLD_DEFAULT) lookups are forwarded as a tail call: glibc finds "next"
// relative to its caller, which must stay the program's object, not this library.
// Other handles: the answer is checked and our hook substituted for a wrapped driver export.
CUDALLOC_EXPORT void* dlsym(void* handle, const char* symbol) {
  const DlsymFn real = real_dlsym();
  // Only a driver name goes further than this file (a sanitizer looks up none). (dlsym's
  // symbol is declared nonnull.)
  const bool driver_name = symbol[0] == 'c' && symbol[1] == 'u';
  if (handle == RTLD_NEXT || handle == RTLD_DEFAULT) {
    if (driver_name) watch_global_lookup(symbol, handle == RTLD_NEXT);
    return real(handle, symbol);
  }
  if (!driver_name || !is_hooked_name(symbol)) return real(handle, symbol);
  return answer_lookup_if_loaded(symbol, real(handle, symbol));
}
