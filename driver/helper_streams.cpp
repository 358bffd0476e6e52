#include "driver/helper_streams.h"

#include <dlfcn.h>

#include <cstring>

namespace cudalloc::shim {

namespace {
// File name prefixes. The libraries link the CUDA runtime statically, so the stream call that
// reaches cudalloc returns into the library itself (libcudnn_graph.so.9, libcublasLt.so.13).
// A library reached through the shared libcudart is not recognised: its streams end the mode.
constexpr const char* kHelperLibraries[] = {"libcudnn", "libcublas"};
}  // namespace

const char* helper_stream_library(const void* return_address) {
  Dl_info info{};
  if (return_address == nullptr || dladdr(return_address, &info) == 0 || info.dli_fname == nullptr) {
    return nullptr;
  }
  const char* slash = std::strrchr(info.dli_fname, '/');
  const char* name = slash != nullptr ? slash + 1 : info.dli_fname;
  for (const char* prefix : kHelperLibraries) {
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) return name;
  }
  return nullptr;
}

}  // namespace cudalloc::shim
