// Green contexts, the cases tests/interpose/green_ctx.cpp leaves out. argv[1] picks one:
//   legacy_async   a block freed by cuMemFreeAsync on a green context's legacy stream (handle 0
//                  with the green context current) is not the primary context's legacy stream's:
//                  the two are not ordered, so stream order does not make its reuse on the
//                  primary's legacy stream safe.
//   single_stream  (CUDALLOC_CONF=single_stream:true) blocks cudaFree'd during the ordered era
//                  belong to the primary's legacy stream, with no fence: the green context's
//                  legacy stream, not ordered with it, must not take them in stream order.
//   detached       a green context destroyed with a stream of its own still alive (the driver
//                  keeps the stream, detached; cuGreenCtxDestroy's documentation): the primary
//                  context's device fences must still record, so freed blocks are reused.
//   per_thread     a green context has no per-thread default stream: the driver refuses every
//                  call that names it (CUDA_ERROR_INVALID_HANDLE, as driver 580
//                  answers), CU_STREAM_PER_THREAD or stream 0 through a _ptsz entry point.
//                  cudalloc gives the same answer, allocates nothing, and frees nothing: the
//                  block stays the program's, intact.
#include <unistd.h>

#include <cstring>
#include <vector>

#include "client.h"

namespace {

using PFN_create = CUresult (*)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned);
using PFN_from = CUresult (*)(CUcontext*, CUgreenCtx);
using PFN_destroy = CUresult (*)(CUgreenCtx);
using PFN_stream = CUresult (*)(CUstream*, CUgreenCtx, unsigned, int);

constexpr std::size_t kBytes = 128u << 20;  // past free_epoch_mb's default, as in green_ctx.cpp

struct Green {
  PFN_create create;
  PFN_from from;
  PFN_destroy destroy;
  PFN_stream stream;
  CUgreenCtx handle = nullptr;
  CUcontext ctx = nullptr;
};

Green make_green(client::Client& c) {
  Green g{};
  g.create = reinterpret_cast<PFN_create>(dlsym(c.rt.handle, "cuGreenCtxCreate"));
  g.from = reinterpret_cast<PFN_from>(dlsym(c.rt.handle, "cuCtxFromGreenCtx"));
  g.destroy = reinterpret_cast<PFN_destroy>(dlsym(c.rt.handle, "cuGreenCtxDestroy"));
  g.stream = reinterpret_cast<PFN_stream>(dlsym(c.rt.handle, "cuGreenCtxStreamCreate"));
  CHECK_OR_DIE(g.create && client::is_cudalloc(reinterpret_cast<void*>(g.from)) &&
               client::is_cudalloc(reinterpret_cast<void*>(g.destroy)) &&
               client::is_cudalloc(reinterpret_cast<void*>(g.stream)));
  CHECK_OR_DIE(g.create(&g.handle, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM) == CUDA_SUCCESS);
  CHECK_OR_DIE(g.from(&g.ctx, g.handle) == CUDA_SUCCESS && g.ctx != nullptr && g.ctx != c.ctx);
  return g;
}

// Bytes of `q` that are not `value`, once the primary context (and so its green ones) is idle.
std::size_t wrong_bytes(client::Client& c, CUdeviceptr q, unsigned char value) {
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  std::vector<unsigned char> host(kBytes);
  CHECK_OR_DIE(c.api.cuMemcpyDtoH_v2(host.data(), q, kBytes) == CUDA_SUCCESS);
  std::size_t wrong = 0;
  for (unsigned char x : host) wrong += x != value;
  return wrong;
}

int legacy_async(client::Client& c) {
  Green g = make_green(c);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(g.ctx) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&p, kBytes, nullptr) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(nullptr, p, kBytes, 0xAA, 300000) == CUDA_SUCCESS);  // green legacy
  CHECK_OR_DIE(c.api.cuMemFreeAsync(p, nullptr) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CUdeviceptr q = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&q, kBytes, nullptr) == CUDA_SUCCESS);  // primary legacy
  CHECK_OR_DIE(c.launch_write(nullptr, q, kBytes, 0x55, 0) == CUDA_SUCCESS);
  const std::size_t wrong = wrong_bytes(c, q, 0x55);
  std::fprintf(stderr, "green_ctx_more legacy_async: reused %d, %zu bytes overwritten\n", q == p, wrong);
  CHECK_OR_DIE(c.api.cuMemFreeAsync(q, nullptr) == CUDA_SUCCESS);
  CHECK_OR_DIE(g.destroy(g.handle) == CUDA_SUCCESS);
  return wrong != 0;
}

// A free and, once its device fence is done, an allocation of kBytes on the primary context:
// whether the block came back. (The allocation after the free records the fence.)
bool reuses(client::Client& c) {
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CUdeviceptr p = 0, r = 0, q = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, kBytes) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&r, kBytes) == CUDA_SUCCESS);
  usleep(20000);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&q, kBytes) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(r) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  return q == p || r == p;
}

int single_stream(client::Client& c) {
  // A block cudaFree'd in the ordered era (on the legacy stream's order, with no fence) while
  // the primary's legacy stream still writes it.
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, kBytes) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(nullptr, p, kBytes, 0xAA, 300000) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  Green g = make_green(c);  // ends single_stream
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(g.ctx) == CUDA_SUCCESS);
  CUdeviceptr q = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&q, kBytes, nullptr) == CUDA_SUCCESS);  // the green legacy stream
  CHECK_OR_DIE(c.launch_write(nullptr, q, kBytes, 0x55, 0) == CUDA_SUCCESS);
  const std::size_t wrong = wrong_bytes(c, q, 0x55);
  std::fprintf(stderr, "green_ctx_more single_stream (green legacy): reused %d, %zu bytes overwritten\n", q == p, wrong);
  CHECK_OR_DIE(g.destroy(g.handle) == CUDA_SUCCESS);
  return wrong != 0;
}

int detached(client::Client& c) {
  Green g = make_green(c);
  CUstream gs = nullptr;
  CHECK_OR_DIE(g.stream(&gs, g.handle, CU_STREAM_NON_BLOCKING, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_sleep(gs, 1000) == CUDA_SUCCESS);  // work of its own on the stream
  const bool before = reuses(c);
  CHECK_OR_DIE(g.destroy(g.handle) == CUDA_SUCCESS);  // gs is left: the driver keeps it, detached
  const bool after = reuses(c);
  // The premise: gs is a handle the driver knows and that refuses every call, even its destroy
  // (CUDA 13), not an unknown one.
  CHECK_OR_DIE(c.api.cuStreamDestroy_v2(gs) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
  std::fprintf(stderr, "green_ctx_more detached: reused before the green context's end %d, after %d\n", before, after);
  CHECK_OR_DIE(before);
  return after ? 0 : 1;
}

// Every memory call naming the per-thread stream under the green context: the driver's refusal,
// and nothing allocated or freed.
int per_thread(client::Client& c) {
  Green g = make_green(c);
  CHECK_OR_DIE(c.api.cuMemAllocAsync_ptsz != nullptr && c.api.cuMemFreeAsync_ptsz != nullptr);
  CUdeviceptr kept = 0;  // the program's block, made under the primary context
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&kept, kBytes) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(nullptr, kept, kBytes, 0x55, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(g.ctx) == CUDA_SUCCESS);
  CUdeviceptr p = 0, q = 0;
  const CUresult alloc = c.api.cuMemAllocAsync(&p, kBytes, CU_STREAM_PER_THREAD);
  const CUresult alloc_ptsz = c.api.cuMemAllocAsync_ptsz(&q, kBytes, nullptr);
  const CUresult free_ = c.api.cuMemFreeAsync(kept, CU_STREAM_PER_THREAD);
  const CUresult free_ptsz = c.api.cuMemFreeAsync_ptsz(kept, nullptr);
  // Still the program's: intact, and freed once, with no error, under the primary context.
  const std::size_t wrong = wrong_bytes(c, kept, 0x55);
  const CUresult free_after = c.api.cuMemFree_v2(kept);
  std::fprintf(stderr,
               "green_ctx_more per_thread: alloc %d, alloc_ptsz %d, free %d, free_ptsz %d (want %d each); "
               "then %zu bytes wrong, free under the primary %d\n",
               alloc, alloc_ptsz, free_, free_ptsz, CUDA_ERROR_INVALID_HANDLE, wrong, free_after);
  CHECK_OR_DIE(g.destroy(g.handle) == CUDA_SUCCESS);
  const bool refused = alloc == CUDA_ERROR_INVALID_HANDLE && alloc_ptsz == CUDA_ERROR_INVALID_HANDLE &&
                       free_ == CUDA_ERROR_INVALID_HANDLE && free_ptsz == CUDA_ERROR_INVALID_HANDLE;
  return refused && wrong == 0 && free_after == CUDA_SUCCESS ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  client::Client& c = client::client();
  const char* which = argc > 1 ? argv[1] : "";
  if (std::strcmp(which, "legacy_async") == 0) return legacy_async(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "single_stream") == 0) return single_stream(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "detached") == 0) return detached(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "per_thread") == 0) return per_thread(c);
  std::fprintf(stderr,
               "usage: green_ctx_more legacy_async|single_stream|detached|per_thread\n");
  return 2;
}
