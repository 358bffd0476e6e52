// GPU soak: the fake-driver soak (tests/soak/soak.cpp) on a real GPU, under cudalloc.
//
// SOAK_THREADS host threads (default 8), each with its own non-blocking stream, plus 4 shared
// streams (2 blocking, 2 non-blocking), allocate blocks of random sizes (cudaMalloc or
// cudaMallocAsync), fill them with their own byte pattern by a kernel, and before freeing:
// queue a check kernel (counts bytes that differ from the pattern into a device counter), and
// sometimes a *late* fill of the same pattern (a kernel that spins up to 2 ms first) on a
// non-blocking stream, then free at once (cudaFree, or cudaFreeAsync on that stream). If the
// allocator handed the block to a new owner before that late fill ran, the new owner's check
// sees foreign bytes. At the end all blocks are freed and cudaMemGetInfo must show the memory
// back (nothing lost).
//
// Run: LD_PRELOAD=libcudalloc.so SOAK_SECONDS=180 build/gpu/soak    (exit 0: clean)
// Built by scripts/gpu-build:  build_one soak "$root/tests/gpu/soak.cu" -Xcompiler -pthread
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common.h"

namespace {

__global__ void fill(unsigned char* p, size_t n, unsigned char v, unsigned long long delay_ns) {
  if (delay_ns != 0 && blockIdx.x == 0 && threadIdx.x == 0) spin_ns(delay_ns);
  if (delay_ns != 0) __syncthreads();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

// Only the first block spins: a grid-wide delay needs one block. Late fills use <<<1, 256>>>.
__global__ void check(const unsigned char* p, size_t n, unsigned char v, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    mine += p[i] != v;
  if (mine) atomicAdd(bad, mine);
}

struct Block {
  unsigned char* p = nullptr;
  size_t n = 0;
  unsigned char v = 0;
  bool async = false;
};

struct Totals {
  std::atomic<unsigned long long> ops{0}, allocs{0}, bytes{0}, checks{0}, late{0}, ooms{0}, errors{0};
};

size_t env_num(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0: case 1: case 2: case 3: return 1 + rng() % 4096;
    case 4: case 5: case 6: return 4096 + rng() % (1 << 20);
    case 7: case 8: return (1 << 20) + rng() % (6 << 20);
    default: return (6 << 20) + rng() % (56 << 20);
  }
}

int grid_for(size_t n) { return (int)std::min<size_t>(1024, (n + 255) / 256); }

void worker(int id, const std::vector<cudaStream_t>& shared, double seconds, uint64_t seed,
            unsigned long long* bad, Totals& t) {
  CHECK_CUDA(cudaSetDevice(0));
  std::mt19937_64 rng(seed * 7919 + id);
  cudaStream_t own;
  CHECK_CUDA(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  std::vector<Block> live;
  unsigned counter = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto release = [&](const Block& b) {
    // The check runs on `own` after the owner's fill (also on `own`) and before the free.
    check<<<grid_for(b.n), 256, 0, own>>>(b.p, b.n, b.v, bad);
    t.checks++;
    const unsigned how = rng() % 6;
    if (how < 2) {
      cudaStream_t s = how == 0 ? own : shared[1 + 2 * (rng() % 2)];  // a non-blocking stream
      if (s != own) {  // the late write must come after the check: order s after own
        cudaEvent_t e;
        CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        CHECK_CUDA(cudaEventRecord(e, own));
        CHECK_CUDA(cudaStreamWaitEvent(s, e, 0));
        CHECK_CUDA(cudaEventDestroy(e));
      }
      fill<<<1, 256, 0, s>>>(b.p, std::min<size_t>(b.n, 1 << 20), b.v, 200000 + rng() % 1800000);
      t.late++;
      // cudaFreeAsync only for stream-ordered allocations (the first version also used it on
      // cudaMalloc'd pointers and hit an illegal address natively).
      if (b.async) CHECK_CUDA(cudaFreeAsync(b.p, s));
      else CHECK_CUDA(cudaFree(b.p));
    } else if (b.async) {
      // A stream-ordered allocation is freed in stream order (cudaFree of it with work still
      // queued on the non-blocking stream also hit an illegal address natively).
      CHECK_CUDA(cudaFreeAsync(b.p, own));
    } else {
      CHECK_CUDA(cudaFree(b.p));
    }
  };
  while (std::chrono::steady_clock::now() < end) {
    t.ops++;
    const unsigned op = rng() % 100;
    if (op < 50 && live.size() < 24) {
      Block b;
      b.n = random_size(rng);
      b.v = (unsigned char)(1 + (id * 37 + ++counter) % 255);
      b.async = rng() % 2;
      cudaError_t r = b.async ? cudaMallocAsync((void**)&b.p, b.n, own) : cudaMalloc((void**)&b.p, b.n);
      if (r == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        t.ooms++;
        continue;
      }
      CHECK_CUDA(r);
      t.allocs++;
      t.bytes += b.n;
      fill<<<grid_for(b.n), 256, 0, own>>>(b.p, b.n, b.v, 0);
      live.push_back(b);
    } else if (op < 92 && !live.empty()) {
      const size_t i = rng() % live.size();
      const Block b = live[i];
      live[i] = live.back();
      live.pop_back();
      release(b);
    } else if (!live.empty()) {
      const Block& b = live[rng() % live.size()];
      check<<<grid_for(b.n), 256, 0, own>>>(b.p, b.n, b.v, bad);
      t.checks++;
    } else {
      CHECK_CUDA(cudaStreamSynchronize(own));
    }
  }
  for (const Block& b : live) release(b);
  CHECK_CUDA(cudaStreamSynchronize(own));
  CHECK_CUDA(cudaStreamDestroy(own));
}

}  // namespace

int main() {
  const double seconds = (double)env_num("SOAK_SECONDS", 180);
  const int threads = (int)env_num("SOAK_THREADS", 8);
  const uint64_t seed = env_num("SOAK_SEED", std::random_device{}());
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(nullptr));
  size_t free0 = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free0, &total));
  std::vector<cudaStream_t> shared(4);
  for (int i = 0; i < 4; ++i)
    CHECK_CUDA(cudaStreamCreateWithFlags(&shared[i], i % 2 ? cudaStreamNonBlocking : cudaStreamDefault));
  unsigned long long* bad = nullptr;
  CHECK_CUDA(cudaMallocHost(&bad, sizeof *bad));  // pinned: not from the device allocator
  *bad = 0;
  Totals t;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker, i, std::cref(shared), seconds, seed, bad, std::ref(t));
  for (auto& th : pool) th.join();
  CHECK_CUDA(cudaDeviceSynchronize());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto s : shared) CHECK_CUDA(cudaStreamDestroy(s));
  size_t free1 = 0;
  CHECK_CUDA(cudaMemGetInfo(&free1, &total));
  const long long lost = (long long)free0 - (long long)free1;
  std::printf("gpu soak: %d threads, %.1f s, seed %llu: %llu ops, %llu allocs (%.1f GiB), %llu checks, %llu late "
              "writes before a free, %llu OOM; corrupted bytes: %llu, memory not returned: %lld B\n",
              threads, took, (unsigned long long)seed, t.ops.load(), t.allocs.load(), t.bytes.load() / 1073741824.0,
              t.checks.load(), t.late.load(), t.ooms.load(), *bad, lost);
  // cudaMemGetInfo under cudalloc counts cached memory as free. The driver keeps a few MiB of
  // its own after this much work on a dozen streams (natively and with cudalloc alike), hence the slack.
  const long long slack = (long long)env_num("SOAK_SLACK_MB", 32) << 20;
  return *bad == 0 && lost <= slack ? 0 : 1;
}
