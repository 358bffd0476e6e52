// A solver loop written the way legacy CUDA codes are: every iteration cudaMalloc's its
// temporaries, runs a few small kernels, copies a scalar back and cudaFree's the temporaries.
//   legacy_loop [--n N] [--iters I]
// Jacobi sweeps of a Poisson problem on an N x N grid. Per iteration: 4 cudaMalloc (the new
// iterate, the residual field, per-block partial sums, the norm), a sweep, a residual, a
// two-pass deterministic reduction, a cudaMemcpy of the norm to the host, 4 cudaFree (the old
// iterate among them). Prints one line that scripts/bench parses:
//   legacy n=N iters=I temps=4 median_us=... mean_us=... p99_us=... norm=... checksum=0x...
// The checksum (the bits of the last residual norm and of the sum of the final iterate) must
// be the same with and without cudalloc: every value is computed in a fixed order.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(3);                                                                   \
    }                                                                                 \
  } while (0)

using Clock = std::chrono::steady_clock;
constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

__global__ void fill(float* a, size_t count, float value) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    a[i] = value;
  }
}

// One Jacobi sweep of -laplace(u) = f with u = 0 on the boundary; writes every cell of out.
__global__ void jacobi(const float* u, const float* f, float* out, int n, float h2) {
  const size_t count = size_t(n) * n;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    const int y = int(i / n), x = int(i % n);
    if (x == 0 || y == 0 || x == n - 1 || y == n - 1) {
      out[i] = 0.0f;
    } else {
      out[i] = 0.25f * (u[i - 1] + u[i + 1] + u[i - n] + u[i + n] + h2 * f[i]);
    }
  }
}

// r = f + laplace(u), squared, per cell (0 on the boundary).
__global__ void residual(const float* u, const float* f, float* r, int n, float inv_h2) {
  const size_t count = size_t(n) * n;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    const int y = int(i / n), x = int(i % n);
    float v = 0.0f;
    if (!(x == 0 || y == 0 || x == n - 1 || y == n - 1)) {
      v = f[i] + inv_h2 * (u[i - 1] + u[i + 1] + u[i - n] + u[i + n] - 4.0f * u[i]);
    }
    r[i] = v * v;
  }
}

// Sum of a[0..count) per block, in a fixed order (grid-stride, then a shared-memory tree).
__global__ void block_sum(const float* a, size_t count, float* partial) {
  __shared__ float s[kThreads];
  float acc = 0.0f;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    acc += a[i];
  }
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

static int blocks_for(size_t count) {
  return int(std::min<size_t>(kMaxBlocks, (count + kThreads - 1) / kThreads));
}

// Legacy style: the scratch of the reduction is allocated and freed inside.
static float device_sum(const float* a, size_t count) {
  const int blocks = blocks_for(count);
  float* partial = nullptr;
  float* total = nullptr;
  CHECK(cudaMalloc(&partial, sizeof(float) * blocks));
  CHECK(cudaMalloc(&total, sizeof(float)));
  block_sum<<<blocks, kThreads>>>(a, count, partial);
  block_sum<<<1, kThreads>>>(partial, size_t(blocks), total);
  CHECK(cudaGetLastError());
  float h = 0.0f;
  CHECK(cudaMemcpy(&h, total, sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(partial));
  CHECK(cudaFree(total));
  return h;
}

static uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

int main(int argc, char** argv) {
  int n = 1024, iters = 1000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--n") && i + 1 < argc) n = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--n N] [--iters I]\n", argv[0]);
      return 2;
    }
  }
  if (n < 3 || iters < 1) {
    std::fprintf(stderr, "need --n >= 3 and --iters >= 1\n");
    return 2;
  }
  const size_t count = size_t(n) * n, bytes = count * sizeof(float);
  const float h = 1.0f / float(n - 1), h2 = h * h, inv_h2 = 1.0f / h2;
  const int blocks = blocks_for(count);
  CHECK(cudaFree(nullptr));  // the context, outside the timings

  float *u = nullptr, *f = nullptr;
  CHECK(cudaMalloc(&u, bytes));
  CHECK(cudaMalloc(&f, bytes));
  fill<<<blocks, kThreads>>>(u, count, 0.0f);
  fill<<<blocks, kThreads>>>(f, count, 1.0f);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  const int warmup = std::min(10, iters);
  std::vector<double> us;
  us.reserve(iters);
  float norm = 0.0f;
  for (int it = 0; it < warmup + iters; ++it) {
    const auto t0 = Clock::now();
    float* next = nullptr;
    float* r = nullptr;
    CHECK(cudaMalloc(&next, bytes));
    CHECK(cudaMalloc(&r, bytes));
    jacobi<<<blocks, kThreads>>>(u, f, next, n, h2);
    residual<<<blocks, kThreads>>>(next, f, r, n, inv_h2);
    CHECK(cudaGetLastError());
    norm = device_sum(r, count);  // 2 more cudaMalloc/cudaFree pairs and the copy back
    CHECK(cudaFree(u));
    CHECK(cudaFree(r));
    u = next;
    if (it >= warmup) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  const float total = device_sum(u, count);
  CHECK(cudaFree(u));
  CHECK(cudaFree(f));

  double mean = 0;
  for (double v : us) mean += v;
  mean /= us.size();
  std::sort(us.begin(), us.end());
  std::printf("legacy n=%d iters=%d temps=4 median_us=%.2f mean_us=%.2f p99_us=%.2f norm=%.6e checksum=0x%08x%08x\n",
              n, iters, us[us.size() / 2], mean, us[std::min(us.size() - 1, size_t(us.size() * 0.99))],
              double(norm), bits(norm), bits(total));
  return 0;
}
