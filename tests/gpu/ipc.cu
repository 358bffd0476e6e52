// IPC: a handle taken for an allocation must give another process the right bytes. Under a
// sub-allocating cache the call may instead fail cleanly; it must never hand out wrong bytes.
//   ipc            parent: allocate, fill, export, run the child, check its answer
//   ipc child HEX  child: open the handle, read, print a checksum
//   ipc reuse      a block freed and taken again in one stream's order while its old owner's
//                  kernel is still queued, then exported: the importer's write must survive
//                  that kernel (the exporter waits for it; the importer is ordered behind
//                  nothing of the exporter's). Natively the pool's memory cannot be exported:
//                  that is a clean refusal.
//   ipc write HEX N  child: open the handle, set N bytes to 0x22, print "written"
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

// The old owner's late write: spins ~300 ms, then fills.
__global__ void late_fill(unsigned* p, size_t n) {
  if (blockIdx.x == 0 && threadIdx.x == 0) spin_ns(300ull * 1000 * 1000);
  __syncthreads();
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 0xAAAAAAAAu;
}

static int reuse(const char* self) {
  const size_t m = size_t{64} << 20;  // a segment of its own under cudalloc: exportable
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p;
  CHECK_CUDA(cudaMallocAsync(&p, m, s));
  late_fill<<<1, 256, 0, s>>>(static_cast<unsigned*>(p), m / 4);  // one block: the spin holds it all
  CHECK_CUDA(cudaFreeAsync(p, s));
  void* q;
  CHECK_CUDA(cudaMallocAsync(&q, m, s));
  cudaIpcMemHandle_t h;
  if (cudaIpcGetMemHandle(&h, q) != cudaSuccess) {
    cudaGetLastError();
    std::printf("ipc reuse: refused reused=%d\n", p == q);
    return 0;
  }
  std::string cmd = std::string(self) + " write " + hex(&h, sizeof h) + " " + std::to_string(m);
  FILE* f = popen(cmd.c_str(), "r");
  char said[32] = {0};
  if (f == nullptr || fscanf(f, "%31s", said) != 1) said[0] = 0;
  if (f) pclose(f);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<unsigned char> v(m);
  CHECK_CUDA(cudaMemcpy(v.data(), q, m, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (unsigned char c : v) wrong += c != 0x22;
  std::printf("ipc reuse: reused=%d importer=%s wrong_bytes=%zu of %zu\n", p == q, said, wrong, m);
  return wrong == 0 && std::strcmp(said, "written") == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const size_t n = 1 << 20;
  if (argc == 2 && std::strcmp(argv[1], "reuse") == 0) return reuse(argv[0]);
  if (argc == 4 && std::strcmp(argv[1], "write") == 0) {
    cudaIpcMemHandle_t h;
    for (size_t i = 0; i < sizeof h; ++i) sscanf(argv[2] + 2 * i, "%2hhx", reinterpret_cast<unsigned char*>(&h) + i);
    const size_t m = std::strtoull(argv[3], nullptr, 10);
    void* p;
    CHECK_CUDA(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    CHECK_CUDA(cudaMemset(p, 0x22, m));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaIpcCloseMemHandle(p));
    std::printf("written\n");
    return 0;
  }
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
