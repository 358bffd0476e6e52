// dlsym(RTLD_NEXT, ...) from a library must search after that library, also with cudalloc's
// dlsym in between (it forwards such lookups as a tail call, keeping the caller's address).
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstring>

extern "C" const char* which_lib();
extern "C" void* next_which();
extern "C" int a_only();

int main() {
  // Where next_a and next_b are in the search order decides the right answer.
  int pos_a = -1, pos_b = -1, i = 0;
  for (link_map* m = _r_debug.r_map; m != nullptr; m = m->l_next, ++i) {
    if (std::strstr(m->l_name, "libnext_a")) pos_a = i;
    if (std::strstr(m->l_name, "libnext_b")) pos_b = i;
  }
  void* a = dlsym(dlopen("libnext_a.so", RTLD_NOW | RTLD_NOLOAD), "which_lib");
  void* expected = pos_a > pos_b ? a : nullptr;
  if (pos_a < 0 || pos_b < 0 || a == nullptr || a_only() != 1) return 3;
  if (next_which() != expected) {
    std::fprintf(stderr, "dlsym(RTLD_NEXT) answered relative to the wrong object: %p, expected %p (a at %d, b at %d)\n", next_which(), expected, pos_a, pos_b);
    return 1;
  }
  return 0;
}
