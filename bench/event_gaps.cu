// What an event record between two kernels costs the GPU: the question behind cudalloc's device
// fences in GPU-bound PyTorch steps (a large-batch training step records a fence every few
// kernels, each an event on the legacy stream between the step's kernels).
//   event_gaps [--kernels N] [--rounds R]
// For each kernel length, queues a 30 ms blocker, then N kernels that fill the GPU (4 blocks of
// 256 threads per SM, each spinning for the length), on the legacy stream, and times them with
// two timing events: with nothing between the kernels (plain), with a cuEventRecord of a
// timing-disabled event after each (record, as a fence does), and with a cuStreamWriteValue32
// after each (write_value, a lighter way to mark progress). The blocker keeps the host ahead, so
// the times are the GPU's. Prints each mode's median over R rounds and the cost per mark.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.h"

namespace {

__global__ void spin_kernel(unsigned long long ns) { spin_ns(ns); }

enum Mode { kPlain, kRecord, kWriteValue, kModes };
const char* kModeNames[kModes] = {"plain", "record", "write_value"};

float run(Mode mode, int kernels, unsigned long long kernel_ns, int grid, std::vector<CUevent>& marks,
          CUdeviceptr flag) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  spin_kernel<<<1, 1>>>(30ull * 1000 * 1000);  // the host queues everything behind it
  CHECK_CUDA(cudaEventRecord(start, 0));
  for (int i = 0; i < kernels; ++i) {
    spin_kernel<<<grid, 256>>>(kernel_ns);
    if (mode == kRecord) CHECK_CU(cuEventRecord(marks[static_cast<std::size_t>(i) % marks.size()], CU_STREAM_LEGACY));
    if (mode == kWriteValue) CHECK_CU(cuStreamWriteValue32(CU_STREAM_LEGACY, flag, static_cast<cuuint32_t>(i), 0));
  }
  CHECK_CUDA(cudaEventRecord(stop, 0));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int kernels = 1000, rounds = 7;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--kernels") && i + 1 < argc) kernels = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: event_gaps [--kernels N] [--rounds R]\n");
      return 2;
    }
  }
  CHECK_CUDA(cudaFree(nullptr));
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<CUevent> marks(64);
  for (CUevent& e : marks) CHECK_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr flag = 0;
  CHECK_CU(cuMemAlloc(&flag, 4));
  for (unsigned long long us : {5ull, 20ull, 100ull}) {
    std::vector<float> ms[kModes];
    for (int r = 0; r < rounds; ++r) {
      for (int m = 0; m < kModes; ++m) {  // interleaved, so that clock drift meets every mode
        const Mode mode = static_cast<Mode>((m + r) % kModes);
        ms[mode].push_back(run(mode, kernels, us * 1000, sms * 4, marks, flag));
      }
    }
    float median[kModes];
    for (int m = 0; m < kModes; ++m) {
      std::sort(ms[m].begin(), ms[m].end());
      median[m] = ms[m][ms[m].size() / 2];
    }
    for (int m = 0; m < kModes; ++m) {
      std::printf("event_gaps kernel_us=%llu kernels=%d mode=%s median_ms=%.3f min_ms=%.3f max_ms=%.3f per_mark_ns=%.0f\n",
                  us, kernels, kModeNames[m], median[m], ms[m].front(), ms[m].back(),
                  (median[m] - median[kPlain]) * 1e6 / kernels);
    }
  }
  return 0;
}
