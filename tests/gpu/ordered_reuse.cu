// cudaFree'd blocks handed out again before their last owner's work ran, in a program with no
// non-blocking stream: cudalloc closes the free epoch with one event on the legacy stream and
// relies on the legacy stream's rules (blocking and per-thread default streams wait for
// earlier legacy work; legacy work waits for earlier work on them) to run every new owner's
// work after the old owner's. The late kernels here write 0xAA after ~30 ms, from a blocking
// stream or from another thread's per-thread default stream; the new owners write 0x55 from
// another blocking stream or from another thread's per-thread default stream; a non-blocking
// stream created afterwards writes 0x77 over the first freed block to come back. Any other byte
// at the end means the order broke. Exits 1 on corruption, 2 if no block came back early
// (nothing was tested).
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "common.h"

__global__ void late_write(unsigned char* p, size_t n, unsigned long long delay_ns) {
  if (threadIdx.x == 0 && blockIdx.x == 0) spin_ns(delay_ns);
  __syncthreads();
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 0xAA;
}

__global__ void count_not(const unsigned char* p, size_t n, unsigned char v, unsigned long long* bad) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (p[i] != v) atomicAdd(bad, 1ull);
}

int main() {
  const size_t n = 16 << 20;  // four fill the 64 MiB free epoch
  cudaStream_t old_owner, new_owner;
  CHECK_CUDA(cudaStreamCreate(&old_owner));
  CHECK_CUDA(cudaStreamCreate(&new_owner));
  cudaEvent_t late_done;
  CHECK_CUDA(cudaEventCreateWithFlags(&late_done, cudaEventDisableTiming));
  unsigned long long* bad;
  CHECK_CUDA(cudaMallocHost(&bad, sizeof(*bad)));
  int rounds = 12, early_rounds = 0;
  unsigned long long reused = 0, corrupted = 0;
  for (int round = 0; round < rounds; ++round) {
    // Rounds of three kinds: old and new owners on two blocking streams; new owners on another
    // thread's per-thread default stream; old owners on another thread's per-thread default stream.
    const bool per_thread = round % 3 == 1;
    const bool old_per_thread = round % 3 == 2;
    std::set<unsigned char*> freed;
    auto queue_late = [&] {
      cudaStream_t s = old_per_thread ? cudaStreamPerThread : old_owner;
      for (int i = 0; i < 4; ++i) {
        unsigned char* p;
        CHECK_CUDA(cudaMalloc(&p, n));
        late_write<<<64, 256, 0, s>>>(p, n, 30ull * 1000 * 1000);
        freed.insert(p);
      }
      CHECK_CUDA(cudaEventRecord(late_done, s));
    };
    if (old_per_thread) {
      std::thread t(queue_late);
      t.join();
    } else {
      queue_late();
    }
    for (unsigned char* p : freed) CHECK_CUDA(cudaFree(p));
    std::vector<unsigned char*> got;
    unsigned char* kept = nullptr;  // the first freed block to come back: left for a non-blocking stream
    auto take = [&] {
      for (int i = 0; i < 8; ++i) {
        unsigned char* q;
        CHECK_CUDA(cudaMalloc(&q, n));
        if (kept == nullptr && freed.count(q) != 0) {
          kept = q;
          continue;
        }
        CHECK_CUDA(cudaMemsetAsync(q, 0x55, n, per_thread ? cudaStreamPerThread : new_owner));
        got.push_back(q);
      }
    };
    if (per_thread) {
      std::thread t(take);
      t.join();
    } else {
      take();
    }
    for (unsigned char* q : got) reused += freed.count(q);
    reused += kept != nullptr;
    const bool early = cudaEventQuery(late_done) == cudaErrorNotReady && kept != nullptr;
    early_rounds += early;
    cudaStream_t later = nullptr;
    if (kept != nullptr) {  // a non-blocking stream made now must run behind the late kernels
      CHECK_CUDA(cudaStreamCreateWithFlags(&later, cudaStreamNonBlocking));
      CHECK_CUDA(cudaMemsetAsync(kept, 0x77, n, later));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    *bad = 0;
    for (unsigned char* q : got) count_not<<<64, 256>>>(q, n, 0x55, bad);
    if (kept != nullptr) count_not<<<64, 256>>>(kept, n, 0x77, bad);
    CHECK_CUDA(cudaDeviceSynchronize());
    corrupted += *bad;
    for (unsigned char* q : got) CHECK_CUDA(cudaFree(q));
    if (kept != nullptr) CHECK_CUDA(cudaFree(kept));
    if (later != nullptr) CHECK_CUDA(cudaStreamDestroy(later));
  }
  std::printf("ordered_reuse: rounds=%d early_rounds=%d reused_blocks=%llu corrupted_bytes=%llu\n", rounds,
              early_rounds, reused, corrupted);
  if (corrupted != 0) return 1;
  return early_rounds > 0 ? 0 : 2;
}
