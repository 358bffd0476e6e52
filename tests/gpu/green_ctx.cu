// Green contexts share their device's primary context memory: a block allocated under either
// may be used by kernels of the other. A freed block must not be handed out again while a
// kernel of the other context still writes it (natively cudaFree waits for the device).
// Memory calls naming the per-thread default stream, which a green context does not have, fail
// there as natively. Prints, for each case, whether the next owner's bytes were overwritten,
// the per-thread calls' errors, and whether a block allocated under a green context outlives it;
// scripts/gpu-test compares the output with and without cudalloc.
#include <cuda.h>

#include <unistd.h>

#include <vector>

#include "common.h"

__global__ void late_fill(unsigned char* p, size_t n, unsigned char v, unsigned long long delay_ns) {
  if (blockIdx.x == 0 && threadIdx.x == 0) spin_ns(delay_ns);
  __syncthreads();
  if (blockIdx.x != 0) spin_ns(delay_ns);
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

// Past free_epoch_mb's default (64 MiB): the free closes cudalloc's free epoch, so the next
// allocation may take the block back once the owner's fence is done.
constexpr size_t kBytes = 128u << 20;

// `owner` allocates and frees the block; `user` runs a kernel on `stream` (null: its default
// stream) that writes it for 300 ms after the free was issued. Returns how many of the next
// owner's bytes were overwritten.
static size_t reuse_across(CUcontext owner, CUcontext user, CUstream stream) {
  CHECK_CU(cuCtxSetCurrent(owner));
  void* a = nullptr;
  CHECK_CUDA(cudaMalloc(&a, kBytes));
  CHECK_CUDA(cudaMemset(a, 0, kBytes));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CU(cuCtxSetCurrent(user));
  late_fill<<<64, 256, 0, stream>>>(static_cast<unsigned char*>(a), kBytes, 0xAA, 300'000'000ull);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CU(cuCtxSetCurrent(owner));
  CHECK_CUDA(cudaFree(a));
  usleep(20000);  // the owner's own streams are idle: a fence recorded on them is done by now
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&b, kBytes));
  std::fprintf(stderr, "reused: %d\n", a == b);
  CHECK_CUDA(cudaMemset(b, 0x55, kBytes));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CU(cuCtxSetCurrent(user));
  CHECK_CU(cuCtxSynchronize());
  CHECK_CU(cuCtxSetCurrent(owner));
  std::vector<unsigned char> host(kBytes);
  CHECK_CUDA(cudaMemcpy(host.data(), b, kBytes, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (unsigned char x : host) wrong += x != 0x55;
  CHECK_CUDA(cudaFree(b));
  return wrong;
}

// A green context has no per-thread default stream: memory calls naming it there fail, and a
// block freed that way stays the program's. Prints the error codes and whether the block was
// intact and freed once afterwards.
static void per_thread_refused(CUcontext primary, CUcontext green) {
  CHECK_CU(cuCtxSetCurrent(primary));
  void* kept = nullptr;
  CHECK_CUDA(cudaMalloc(&kept, 1 << 20));
  CHECK_CUDA(cudaMemset(kept, 0x55, 1 << 20));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CU(cuCtxSetCurrent(green));
  void* r = nullptr;
  const cudaError_t alloc = cudaMallocAsync(&r, 1 << 20, cudaStreamPerThread);
  const cudaError_t free_ = cudaFreeAsync(kept, cudaStreamPerThread);
  (void)cudaGetLastError();
  CHECK_CU(cuCtxSetCurrent(primary));
  unsigned char byte = 0;
  CHECK_CUDA(cudaMemcpy(&byte, static_cast<unsigned char*>(kept) + 777, 1, cudaMemcpyDeviceToHost));
  const cudaError_t freed = cudaFree(kept);
  std::printf("per-thread stream under the green context: cudaMallocAsync %d, cudaFreeAsync %d; "
              "the block then holds %d, cudaFree %d\n",
              static_cast<int>(alloc), static_cast<int>(free_), byte, static_cast<int>(freed));
}

int main() {
  CHECK_CU(cuInit(0));
  CHECK_CUDA(cudaFree(nullptr));  // the runtime's primary context, current
  CUcontext primary = nullptr;
  CHECK_CU(cuCtxGetCurrent(&primary));
  CUdevice dev = 0;
  CHECK_CU(cuCtxGetDevice(&dev));
  CUgreenCtx green = make_green_context(dev);
  CUcontext gctx = nullptr;
  CHECK_CU(cuCtxFromGreenCtx(&gctx, green));

  CUstream green_stream = nullptr;  // made while the primary context is current
  CHECK_CU(cuGreenCtxStreamCreate(&green_stream, green, CU_STREAM_NON_BLOCKING, 0));
  CHECK_CU(cuCtxSetCurrent(gctx));
  CUstream green_stream_in = nullptr;  // made while the green context is current
  CHECK_CU(cuGreenCtxStreamCreate(&green_stream_in, green, CU_STREAM_NON_BLOCKING, 0));
  CHECK_CU(cuCtxSetCurrent(primary));
  CUstream primary_stream = nullptr;
  CHECK_CU(cuStreamCreate(&primary_stream, CU_STREAM_NON_BLOCKING));
  struct Case {
    const char* name;
    CUcontext owner, user;
    CUstream stream;
  };
  const Case cases[] = {
      {"primary block, green kernel on its default stream", primary, gctx, nullptr},
      {"green block, primary kernel on its default stream", gctx, primary, nullptr},
      {"primary block, green kernel on a green stream made under the primary", primary, gctx, green_stream},
      {"primary block, green kernel on a green stream made under the green context", primary, gctx, green_stream_in},
      {"green block, primary kernel on a non-blocking stream", gctx, primary, primary_stream},
  };
  for (const Case& c : cases) {
    const size_t wrong = reuse_across(c.owner, c.user, c.stream);
    std::printf("%s: %s\n", c.name, wrong == 0 ? "intact" : "overwritten");
    if (wrong != 0) std::fprintf(stderr, "%s: %zu of %zu bytes overwritten\n", c.name, wrong, kBytes);
  }
  per_thread_refused(primary, gctx);
  CHECK_CU(cuCtxSetCurrent(primary));
  CHECK_CU(cuStreamDestroy(green_stream));
  CHECK_CU(cuStreamDestroy(green_stream_in));
  CHECK_CU(cuStreamDestroy(primary_stream));

  // A block allocated under the green context outlives it: it is the primary context's memory.
  CHECK_CU(cuCtxSetCurrent(gctx));
  void* kept = nullptr;
  CHECK_CUDA(cudaMalloc(&kept, 1 << 20));
  CHECK_CU(cuCtxSetCurrent(primary));
  CHECK_CU(cuGreenCtxDestroy(green));
  CHECK_CUDA(cudaMemset(kept, 7, 1 << 20));
  unsigned char byte = 0;
  CHECK_CUDA(cudaMemcpy(&byte, static_cast<unsigned char*>(kept) + 12345, 1, cudaMemcpyDeviceToHost));
  const cudaError_t freed = cudaFree(kept);
  std::printf("after the green context's end: value %d, free %d\n", byte, static_cast<int>(freed));
  return 0;
}
