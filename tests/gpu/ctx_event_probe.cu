// What cuCtxRecordEvent (CUDA 12.5+) waits for, natively: whether one event recorded for a
// context covers the work queued on every kind of stream, as a device fence must. Prints one
// line per case, "pending" (the event was not done while the work ran) or "done" (it was), and
// whether it completed once the work had.
//   legacy, per_thread, blocking, non_blocking: a 200 ms kernel queued on that stream first
//   destroyed: the same on a non-blocking stream destroyed before the record
//   green: the same on a non-blocking stream of a green context, the primary context's event
//   graph: a 200 ms kernel in a CUDA graph launched on a non-blocking stream
//   host_func: a 200 ms host function on a non-blocking stream
//   later: a kernel queued after the record (the event must not wait for it: "done")
//   capture: the record while another stream captures (its result, and the capture's state)
#include <cuda.h>

#include <unistd.h>

#include <cstring>

#include "common.h"

namespace {

__global__ void spin_kernel(unsigned long long ns) { spin_ns(ns); }

constexpr unsigned long long kSpin = 200'000'000ull;

const char* state(CUresult r) {
  return r == CUDA_SUCCESS ? "done" : r == CUDA_ERROR_NOT_READY ? "pending" : "error";
}

void CUDART_CB sleep_host(void*) { usleep(200000); }

enum class Work { kKernel, kGraph, kHostFunc };

void probe(const char* name, CUcontext ctx, cudaStream_t stream, bool destroy, bool after,
           Work work = Work::kKernel, cudaGraphExec_t graph = nullptr) {
  CUevent e = nullptr;
  CHECK_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  if (!after) {
    if (work == Work::kGraph) {
      CHECK_CUDA(cudaGraphLaunch(graph, stream));
    } else if (work == Work::kHostFunc) {
      CHECK_CUDA(cudaLaunchHostFunc(stream, sleep_host, nullptr));
    } else {
      spin_kernel<<<1, 1, 0, stream>>>(kSpin);
      CHECK_CUDA(cudaGetLastError());
    }
    if (destroy) CHECK_CUDA(cudaStreamDestroy(stream));
  }
  const CUresult rec = cuCtxRecordEvent(ctx, e);
  if (after) {
    spin_kernel<<<1, 1, 0, stream>>>(kSpin);
    CHECK_CUDA(cudaGetLastError());
  }
  usleep(20000);
  const CUresult during = cuEventQuery(e);
  CHECK_CUDA(cudaDeviceSynchronize());
  const CUresult end = cuEventQuery(e);
  std::printf("ctx_event case=%s record=%d while_running=%s after_sync=%s\n", name, static_cast<int>(rec),
              state(during), state(end));
  cuEventDestroy(e);
}

}  // namespace

int main() {
  CHECK_CUDA(cudaFree(nullptr));
  CUcontext ctx = nullptr;
  CHECK_CU(cuCtxGetCurrent(&ctx));
  cudaStream_t blocking = nullptr, non_blocking = nullptr, doomed = nullptr, capturing = nullptr;
  CHECK_CUDA(cudaStreamCreate(&blocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&doomed, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  probe("legacy", ctx, cudaStreamLegacy, false, false);
  probe("per_thread", ctx, cudaStreamPerThread, false, false);
  probe("blocking", ctx, blocking, false, false);
  probe("non_blocking", ctx, non_blocking, false, false);
  probe("destroyed", ctx, doomed, true, false);
  {
    CUdevice dev = 0;
    CHECK_CU(cuCtxGetDevice(&dev));
    CUgreenCtx green = make_green_context(dev);
    CUstream green_stream = nullptr;
    CHECK_CU(cuGreenCtxStreamCreate(&green_stream, green, CU_STREAM_NON_BLOCKING, 0));
    probe("green", ctx, reinterpret_cast<cudaStream_t>(green_stream), false, false);
    CHECK_CU(cuStreamDestroy(green_stream));
    CHECK_CU(cuGreenCtxDestroy(green));
    CHECK_CU(cuCtxSetCurrent(ctx));
  }
  {
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal));
    spin_kernel<<<1, 1, 0, capturing>>>(kSpin);
    CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));
    cudaGraphExec_t exec = nullptr;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    probe("graph", ctx, non_blocking, false, false, Work::kGraph, exec);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  probe("host_func", ctx, non_blocking, false, false, Work::kHostFunc);
  probe("later", ctx, non_blocking, false, true);

  // A capture in progress on another stream.
  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
  spin_kernel<<<1, 1, 0, capturing>>>(1000);
  CUevent e = nullptr;
  CHECK_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  const CUresult rec = cuCtxRecordEvent(ctx, e);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(capturing, &status);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(capturing, &graph);
  std::printf("ctx_event case=capture record=%d capture_status=%d end_capture=%d\n", static_cast<int>(rec),
              static_cast<int>(status), static_cast<int>(end));
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();
  cuEventDestroy(e);
  return 0;
}
