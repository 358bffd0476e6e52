// The C library's dlsym, for code that must not meet cudalloc's own dlsym override (the
// driver table, the override itself).
#pragma once

namespace cudalloc::shim {

using DlsymFn = void* (*)(void* handle, const char* symbol);

// glibc's dlsym (GLIBC_2.34, or GLIBC_2.2.5 on older C libraries). Never null.
DlsymFn real_dlsym();

}  // namespace cudalloc::shim
