// A CUDA graph captured with cudaMallocAsync/cudaFreeAsync (graph memory nodes), launched
// many times, plus a plain allocation around it.
#include <vector>
#include "common.h"

__global__ void iota(float* p, int n, float base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = base + i;
}
__global__ void add(float* out, const float* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += a[i];
}

int main() {
  const int n = 1 << 16;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* acc;
  CHECK_CUDA(cudaMalloc(&acc, n * sizeof(float)));
  CHECK_CUDA(cudaMemsetAsync(acc, 0, n * sizeof(float), s));
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  float* tmp;
  CHECK_CUDA(cudaMallocAsync(&tmp, n * sizeof(float), s));
  iota<<<(n + 255) / 256, 256, 0, s>>>(tmp, n, 1.0f);
  add<<<(n + 255) / 256, 256, 0, s>>>(acc, tmp, n);
  CHECK_CUDA(cudaFreeAsync(tmp, s));
  CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 10; ++i) CHECK_CUDA(cudaGraphLaunch(exec, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<float> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), acc, n * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += h[i] != 10.0f * (1.0f + i);
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaFree(acc));
  std::printf("graph_async: bad=%d\n", bad);
  return bad == 0 ? 0 : 1;
}
