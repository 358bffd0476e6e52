#include <dlfcn.h>
extern "C" __attribute__((visibility("default"))) const char* which_lib() { return "b"; }
// "Next after this library": nothing defines which_lib after it. Were cudalloc's dlsym not a
// tail call, glibc would search after libcudalloc instead, and find next_a's.
extern "C" __attribute__((visibility("default"))) void* next_which() { return dlsym(RTLD_NEXT, "which_lib"); }
