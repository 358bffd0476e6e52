// Manual smoke test on a real GPU (not built by meson): nvcc -o gpu_smoke gpu_smoke.cu, then
// run with and without LD_PRELOAD=libcudalloc.so; the output must be identical.
#include <cstdio>
#include <chrono>
#include <vector>
#include <cuda_runtime.h>

__global__ void fill(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

int main() {
  long long sum = 0;
  cudaStream_t nb;
  cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
  for (int round = 0; round < 50; ++round) {
    int n = 1000 + round * 997;
    int *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, n * sizeof(int)) != cudaSuccess) return 1;
    fill<<<(n + 255) / 256, 256, 0, nb>>>(a, n, round);
    cudaFree(a);  // work still queued on a non-blocking stream
    if (cudaMallocAsync(&b, n * sizeof(int), nb) != cudaSuccess) return 2;
    fill<<<(n + 255) / 256, 256, 0, nb>>>(b, n, 2 * round);
    std::vector<int> h(n);
    cudaMemcpyAsync(h.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost, nb);
    cudaFreeAsync(b, nb);
    cudaStreamSynchronize(nb);
    for (int x : h) sum += x;
  }
  int* z = nullptr;
  std::printf("malloc0=%d free0=%d\n", (int)cudaMalloc(&z, 0), (int)cudaFree(nullptr));
  int* p;
  cudaMalloc(&p, 4096);
  cudaFree(p);
  std::printf("doublefree=%d\n", (int)cudaFree(p));
  cudaGetLastError();
  auto t0 = std::chrono::steady_clock::now();
  const int iters = 100000;
  for (int i = 0; i < iters; ++i) {
    cudaMalloc(&p, 4096);
    cudaFree(p);
  }
  auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / iters;
  std::printf("sum=%lld\n", sum);
  std::fprintf(stderr, "cudaMalloc+cudaFree pair: %.0f ns\n", ns);
  return 0;
}
