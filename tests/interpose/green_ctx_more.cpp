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
//   per_thread_async   the same as legacy_async on the per-thread default stream
//                  (CU_STREAM_PER_THREAD): each context, green ones included, has one of its own
//                  per thread, and the green context's is not ordered with the primary's.
//   per_thread_back    the other way: freed on the primary's per-thread stream, taken on the
//                  green context's.
//   ptsz_default   per_thread_async through the _ptsz entry points naming stream 0 (code built
//                  with --default-stream per-thread).
//   per_thread_fence   a block freed on the green context's per-thread stream, wanted by a
//                  stream of the primary context: the event that decides whether its last
//                  write is done must be recorded on that stream, in the green context.
//   per_thread_detached  after the green context's end, a block freed on its per-thread stream
//                  is reused without any call into the destroyed context (its per-thread
//                  stream went with it; no fence may try to record there).
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

// A block freed on `from`'s per-thread default stream while a late write still runs there, then
// one of the same size taken on `to`'s: whether the late write reached the new owner's data.
// `ptsz`: through the _ptsz entry points, naming stream 0.
int per_thread(client::Client& c, CUcontext from, CUcontext to, bool ptsz, const char* name) {
  auto alloc_async = ptsz ? c.api.cuMemAllocAsync_ptsz : c.api.cuMemAllocAsync;
  auto free_async = ptsz ? c.api.cuMemFreeAsync_ptsz : c.api.cuMemFreeAsync;
  CHECK_OR_DIE(alloc_async != nullptr && free_async != nullptr);
  CUstream stream = ptsz ? nullptr : CU_STREAM_PER_THREAD;
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(from) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK_OR_DIE(alloc_async(&p, kBytes, stream) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(CU_STREAM_PER_THREAD, p, kBytes, 0xAA, 300000) == CUDA_SUCCESS);
  CHECK_OR_DIE(free_async(p, stream) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(to) == CUDA_SUCCESS);
  CUdeviceptr q = 0;
  CHECK_OR_DIE(alloc_async(&q, kBytes, stream) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(CU_STREAM_PER_THREAD, q, kBytes, 0x55, 0) == CUDA_SUCCESS);
  const std::size_t wrong = wrong_bytes(c, q, 0x55);
  std::fprintf(stderr, "green_ctx_more %s: reused %d, %zu bytes overwritten\n", name, q == p, wrong);
  CHECK_OR_DIE(free_async(q, stream) == CUDA_SUCCESS);
  return wrong != 0;
}

int per_thread_async(client::Client& c) {
  Green g = make_green(c);
  const int r = per_thread(c, g.ctx, c.ctx, false, "per_thread_async");
  CHECK_OR_DIE(g.destroy(g.handle) == CUDA_SUCCESS);
  return r;
}

int per_thread_back(client::Client& c) {
  Green g = make_green(c);
  const int r = per_thread(c, c.ctx, g.ctx, false, "per_thread_back");
  CHECK_OR_DIE(g.destroy(g.handle) == CUDA_SUCCESS);
  return r;
}

int ptsz_default(client::Client& c) {
  Green g = make_green(c);
  const int r = per_thread(c, g.ctx, c.ctx, true, "ptsz_default");
  CHECK_OR_DIE(g.destroy(g.handle) == CUDA_SUCCESS);
  return r;
}

int per_thread_fence(client::Client& c) {
  Green g = make_green(c);
  CUstream s = nullptr;
  CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);  // the primary's
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(g.ctx) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&p, kBytes, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(CU_STREAM_PER_THREAD, p, kBytes, 0xAA, 300000) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFreeAsync(p, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CUdeviceptr q = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&q, kBytes, s) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(s, q, kBytes, 0x55, 0) == CUDA_SUCCESS);
  const std::size_t wrong = wrong_bytes(c, q, 0x55);
  std::fprintf(stderr, "green_ctx_more per_thread_fence: reused %d, %zu bytes overwritten\n", q == p, wrong);
  CHECK_OR_DIE(c.api.cuMemFreeAsync(q, s) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
  CHECK_OR_DIE(g.destroy(g.handle) == CUDA_SUCCESS);
  return wrong != 0;
}

int per_thread_detached(client::Client& c) {
  Green g = make_green(c);
  CUstream s = nullptr;
  CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);  // the primary's
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(g.ctx) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&p, kBytes, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(CU_STREAM_PER_THREAD, p, kBytes, 0xAA, 1000) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFreeAsync(p, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CHECK_OR_DIE(g.destroy(g.handle) == CUDA_SUCCESS);  // its queued work done first (the hook waits)
  const std::uint64_t pushes = c.call_count("cuCtxPushCurrent");
  CUdeviceptr q = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&q, kBytes, s) == CUDA_SUCCESS);
  const std::uint64_t into_green = c.call_count("cuCtxPushCurrent") - pushes;
  std::fprintf(stderr, "green_ctx_more per_thread_detached: reused %d, contexts pushed %llu\n", q == p,
               static_cast<unsigned long long>(into_green));
  CHECK_OR_DIE(c.api.cuMemFreeAsync(q, s) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
  return q == p && into_green == 0 ? 0 : 1;
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

}  // namespace

int main(int argc, char** argv) {
  client::Client& c = client::client();
  const char* which = argc > 1 ? argv[1] : "";
  if (std::strcmp(which, "legacy_async") == 0) return legacy_async(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "single_stream") == 0) return single_stream(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "detached") == 0) return detached(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "per_thread_async") == 0) return per_thread_async(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "per_thread_back") == 0) return per_thread_back(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "ptsz_default") == 0) return ptsz_default(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "per_thread_fence") == 0) return per_thread_fence(c) == 0 ? 0 : 1;
  if (std::strcmp(which, "per_thread_detached") == 0) return per_thread_detached(c) == 0 ? 0 : 1;
  std::fprintf(stderr,
               "usage: green_ctx_more legacy_async|single_stream|detached|per_thread_async|per_thread_back|"
               "ptsz_default|per_thread_fence|per_thread_detached\n");
  return 2;
}
