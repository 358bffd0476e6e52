#include "shim/stats.h"

#include <cstdio>
#include <string>

namespace cudalloc::shim {
namespace {

void print_context_stats(const ContextState& s) {
  std::string text = s.allocator.summary();
  if (s.host.used()) text += s.host.summary();
  std::fputs(text.c_str(), stderr);
}

}  // namespace

void print_stats(const ContextRegistry* contexts) {
  if (contexts == nullptr) {
    std::fprintf(stderr, "cudalloc: passthrough mode, no cache statistics\n");
    return;
  }
  for (ContextState* s : contexts->live()) print_context_stats(*s);
}

void print_vmm_stats(const VmmCache& vmm) { std::fputs(vmm.summary().c_str(), stderr); }

void print_context_end_stats(const ContextState& s) {
  std::fprintf(stderr, "cudalloc: context %p of device %d is being destroyed; its statistics:\n",
               static_cast<void*>(s.ctx), static_cast<int>(s.device));
  print_context_stats(s);
}

}  // namespace cudalloc::shim
