// A process that never touches CUDA is not changed by the preload: it may call dlsym as much
// as it likes (Python does), but no driver is loaded and no thread is started.
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

int main() {
  void* libm = dlopen("libm.so.6", RTLD_NOW);
  if (libm == nullptr) return 2;
  auto* cosine = reinterpret_cast<double (*)(double)>(dlsym(libm, "cos"));
  if (cosine == nullptr || cosine(0.0) != 1.0) return 3;
  if (dlsym(libm, "cuMemAlloc_v2") != nullptr) return 4;  // a cu* name in another library
  if (dlsym(RTLD_DEFAULT, "printf") == nullptr) return 5;
  if (dlsym(RTLD_NEXT, "no_such_symbol") != nullptr) return 6;
  bool preloaded = false;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/libcuda.so") != std::string::npos) {
      std::fprintf(stderr, "driver loaded: %s\n", line.c_str());
      return 7;
    }
    if (line.find("libcudalloc") != std::string::npos) preloaded = true;
  }
  if (!preloaded) {
    std::fprintf(stderr, "libcudalloc is not preloaded\n");
    return 8;
  }
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0 && std::stoi(line.substr(8)) != 1) {
      std::fprintf(stderr, "%s\n", line.c_str());
      return 9;
    }
  }
  return 0;
}
