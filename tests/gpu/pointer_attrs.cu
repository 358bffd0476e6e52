// Pointer attributes of live and freed blocks, printed; scripts/gpu-test compares the output
// with and without cudalloc. A freed block's memory stays in cudalloc's cached segment, but the
// program must be told what the driver tells it of freed memory.
#include <cuda.h>

#include "common.h"

static void show(const char* what, void* p) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  cudaGetLastError();
  std::printf("%s: runtime %d type %d device %d devptr %s\n", what, static_cast<int>(e), static_cast<int>(a.type),
              e == cudaSuccess ? a.device : -99, a.devicePointer == p ? "same" : a.devicePointer ? "other" : "null");
  unsigned type = 12345;
  const CUresult r = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p));
  std::printf("%s: driver %d type %u\n", what, static_cast<int>(r), r == CUDA_SUCCESS ? type : 0u);
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult g = cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(p));
  std::printf("%s: range %d size %zu\n", what, static_cast<int>(g), g == CUDA_SUCCESS ? size : size_t{0});
}

int main() {
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 4096));
  CHECK_CUDA(cudaMalloc(&b, 4096));  // keeps a's segment in use under cudalloc
  show("live", a);
  CHECK_CUDA(cudaFree(a));
  show("freed", a);
  show("live neighbour", b);
  CHECK_CUDA(cudaFree(b));
  return 0;
}
