// IPC: a handle taken for an allocation must give another process the right bytes. Under a
// sub-allocating cache the call may instead fail cleanly; it must never hand out wrong bytes.
//   ipc            parent: allocate, fill, export, run the child, check its answer
//   ipc child HEX  child: open the handle, read, print a checksum
#include <cstring>
#include <string>
#include <vector>
#include "common.h"

static std::string hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<const unsigned char*>(p)[i];
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

static unsigned long long sum_bytes(const std::vector<unsigned char>& v) {
  unsigned long long s = 0;
  for (size_t i = 0; i < v.size(); ++i) s = s * 31 + v[i];
  return s;
}

int main(int argc, char** argv) {
  const size_t n = 1 << 20;
  if (argc == 3 && std::strcmp(argv[1], "child") == 0) {
    cudaIpcMemHandle_t h;
    for (size_t i = 0; i < sizeof h; ++i) sscanf(argv[2] + 2 * i, "%2hhx", reinterpret_cast<unsigned char*>(&h) + i);
    void* p;
    CHECK_CUDA(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    std::vector<unsigned char> v(n);
    CHECK_CUDA(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost));
    std::printf("%llu\n", sum_bytes(v));
    CHECK_CUDA(cudaIpcCloseMemHandle(p));
    return 0;
  }
  int ok = 0, refused = 0, wrong = 0;
  void* spacer;
  CHECK_CUDA(cudaMalloc(&spacer, 4096));
  for (size_t size : {n, size_t{64} << 20}) {
    void* p;
    CHECK_CUDA(cudaMalloc(&p, size));
    std::vector<unsigned char> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 7 + size);
    CHECK_CUDA(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice));
    cudaIpcMemHandle_t h;
    if (cudaIpcGetMemHandle(&h, p) != cudaSuccess) {
      cudaGetLastError();
      ++refused;
      continue;
    }
    std::string cmd = std::string(argv[0]) + " child " + hex(&h, sizeof h);
    FILE* f = popen(cmd.c_str(), "r");
    unsigned long long got = 0;
    if (f == nullptr || fscanf(f, "%llu", &got) != 1) got = ~0ull;
    if (f) pclose(f);
    (got == sum_bytes(v) ? ok : wrong) += 1;
  }
  std::printf("ipc: ok=%d refused=%d wrong=%d\n", ok, refused, wrong);
  return wrong == 0 && ok >= 1 ? 0 : 1;
}
