// cudaFree'd blocks reused at once while no work was queued (the submission watch): the work
// that used a block before its free, however it was queued, keeps it from the next owner until
// it ran; with no work queued, a loop of pairs cycles on one block.
//   quiet_reuse        prints one line per case; exits 1 if a block came back while its last
//                      owner's work was still queued.
// Cases: a kernel, cudaMemsetAsync, cudaMemcpyAsync and a kernel in a CUDA graph, each on a
// non-blocking stream (which no legacy-stream event orders), each followed by 2,000 quiet pairs.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "common.h"

__global__ void late_write(unsigned char* p, size_t n, unsigned long long delay_ns) {
  if (threadIdx.x == 0 && blockIdx.x == 0) spin_ns(delay_ns);
  __syncthreads();
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) p[i] = 0xAA;
}

__global__ void spin(unsigned long long delay_ns) { spin_ns(delay_ns); }

using Clock = std::chrono::steady_clock;

// 2,000 cudaMalloc/cudaFree pairs of `n` bytes: how many handed out `watched` while `s` still
// had work queued, and the distinct pointers.
struct Chase {
  int early = 0;
  int distinct = 0;
  double ns_per_pair = 0;
};
static Chase chase(void* watched, size_t n, cudaStream_t s) {
  Chase c;
  std::set<void*> seen;
  const auto t0 = Clock::now();
  for (int i = 0; i < 2000; ++i) {
    void* q = nullptr;
    CHECK_CUDA(cudaMalloc(&q, n));
    if (q == watched && cudaStreamQuery(s) == cudaErrorNotReady) ++c.early;
    seen.insert(q);
    CHECK_CUDA(cudaFree(q));
  }
  c.ns_per_pair = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / 2000;
  c.distinct = static_cast<int>(seen.size());
  return c;
}

int main() {
  const size_t n = size_t{256} << 20;  // large enough that a memset or a copy of it takes a while
  cudaStream_t nb;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  void* src = nullptr;
  CHECK_CUDA(cudaMalloc(&src, n));
  int early = 0;
  for (const char* mode : {"kernel", "memset", "memcpy", "graph"}) {
    chase(nullptr, n, nb);  // settle: no work queued
    const Chase quiet = chase(nullptr, n, nb);
    void* a = nullptr;
    CHECK_CUDA(cudaMalloc(&a, n));
    // The stream is kept busy first (a spin that touches nothing), so the work on `a` is still
    // queued when it is freed.
    spin<<<1, 1, 0, nb>>>(50ull * 1000 * 1000);
    if (!std::strcmp(mode, "kernel")) {
      late_write<<<1024, 256, 0, nb>>>(static_cast<unsigned char*>(a), n, 0);
    } else if (!std::strcmp(mode, "memset")) {
      CHECK_CUDA(cudaMemsetAsync(a, 0xAA, n, nb));
    } else if (!std::strcmp(mode, "memcpy")) {
      CHECK_CUDA(cudaMemcpyAsync(a, src, n, cudaMemcpyDeviceToDevice, nb));
    } else {
      cudaStream_t cap;
      CHECK_CUDA(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
      cudaGraph_t g;
      cudaGraphExec_t e;
      CHECK_CUDA(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
      late_write<<<1024, 256, 0, cap>>>(static_cast<unsigned char*>(a), n, 0);
      CHECK_CUDA(cudaStreamEndCapture(cap, &g));
      CHECK_CUDA(cudaGraphInstantiate(&e, g, 0));
      // Settled again: only the graph launch queues work on `a` now.
      CHECK_CUDA(cudaStreamSynchronize(nb));
      chase(nullptr, n, nb);
      spin<<<1, 1, 0, nb>>>(50ull * 1000 * 1000);
      CHECK_CUDA(cudaGraphLaunch(e, nb));
      CHECK_CUDA(cudaGraphExecDestroy(e));
      CHECK_CUDA(cudaGraphDestroy(g));
      CHECK_CUDA(cudaStreamDestroy(cap));
    }
    CHECK_CUDA(cudaFree(a));
    const Chase busy = chase(a, n, nb);
    CHECK_CUDA(cudaStreamSynchronize(nb));
    early += busy.early;
    std::printf("quiet_reuse mode=%s early=%d quiet_distinct=%d quiet_ns_per_pair=%.0f\n", mode, busy.early,
                quiet.distinct, quiet.ns_per_pair);
  }
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaStreamDestroy(nb));
  return early == 0 ? 0 : 1;
}
