// Stands in for a library that runs parts of a call on streams of its own and orders them with
// its caller's stream (cuDNN, cuBLASLt): built as libcudnn_forkjoin_test.so, so that cudalloc
// recognises the streams it creates as helper streams (driver/helper_streams.h).
#include <cuda.h>

extern "C" __attribute__((visibility("default"), noinline)) int forkjoin_make_stream(
    CUresult (*create)(CUstream*, unsigned), CUstream* out) {
  const CUresult r = create(out, CU_STREAM_NON_BLOCKING);
  // Work after the call keeps it from being a tail call: the driver call must return here.
  __asm__ volatile("" ::: "memory");
  return r == CUDA_SUCCESS ? 0 : static_cast<int>(r);
}
