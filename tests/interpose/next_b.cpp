#include <dlfcn.h>
extern "C" __attribute__((visibility("default"))) const char* which_lib() { return "b"; }
// "Next after this library": nothing defines which_lib after it. Were cudalloc's dlsym not a
// tail call, glibc would search after libcudalloc instead, and find next_a's. (No sibling
// call here either, or the caller glibc sees would be rtld_next itself.)
extern "C" __attribute__((visibility("default"), optimize("no-optimize-sibling-calls"))) void* next_which() {
  void* p = dlsym(RTLD_NEXT, "which_lib");
  __asm__ volatile("" : "+r"(p));
  return p;
}
