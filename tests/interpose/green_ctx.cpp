// Green contexts share their device's primary context memory: a block allocated under either
// may be used by the other's kernels. A block freed under one must not be handed out again
// while the other's queued work still writes it, and a block allocated under a green context
// outlives it (tests/gpu/green_ctx.cu checks the same on a GPU).
#include <unistd.h>

#include <vector>

#include "client.h"

namespace {

using PFN_create = CUresult (*)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned);
using PFN_from = CUresult (*)(CUcontext*, CUgreenCtx);
using PFN_destroy = CUresult (*)(CUgreenCtx);
using PFN_green_stream = CUresult (*)(CUstream*, CUgreenCtx, unsigned, int);

// Past free_epoch_mb's default (64 MiB): the free closes cudalloc's free epoch, so the next
// allocation may take the block back once the owner's fence is done.
constexpr std::size_t kBytes = 128u << 20;

// `owner` allocates and frees the block while `user_stream` (of the other context, made
// current for the launch as `user`) writes it for 300 ms. Returns the bytes of the next
// owner's block that are not what it wrote.
std::size_t reuse_across(client::Client& c, CUcontext owner, CUcontext user, CUstream user_stream, bool* reused) {
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(owner) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, kBytes) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(user) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.launch_write(user_stream, p, kBytes, 0xAA, 300000) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(owner) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  usleep(20000);  // a fence on the owner's own, idle streams is done by now
  CUdeviceptr q = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&q, kBytes) == CUDA_SUCCESS);
  *reused = q == p;
  CHECK_OR_DIE(c.launch_write(nullptr, q, kBytes, 0x55, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);  // the primary context's waits for its green ones
  std::vector<unsigned char> host(kBytes);
  CHECK_OR_DIE(c.api.cuMemcpyDtoH_v2(host.data(), q, kBytes) == CUDA_SUCCESS);
  std::size_t wrong = 0;
  for (unsigned char x : host) wrong += x != 0x55;
  CHECK_OR_DIE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
  return wrong;
}

}  // namespace

int main() {
  client::Client& c = client::client();
  // Programs reach these by name (the runtime looks none of them up): cudalloc's hooks for
  // cuCtxFromGreenCtx and cuGreenCtxDestroy, through its dlsym.
  auto create = reinterpret_cast<PFN_create>(dlsym(c.rt.handle, "cuGreenCtxCreate"));
  auto from = reinterpret_cast<PFN_from>(dlsym(c.rt.handle, "cuCtxFromGreenCtx"));
  auto destroy = reinterpret_cast<PFN_destroy>(dlsym(c.rt.handle, "cuGreenCtxDestroy"));
  CHECK_OR_DIE(create != nullptr && client::is_cudalloc(reinterpret_cast<void*>(from)) &&
               client::is_cudalloc(reinterpret_cast<void*>(destroy)));
  CUgreenCtx green = nullptr;
  CHECK_OR_DIE(create(&green, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM) == CUDA_SUCCESS);
  CUcontext gctx = nullptr;
  CHECK_OR_DIE(from(&gctx, green) == CUDA_SUCCESS && gctx != nullptr && gctx != c.ctx);
  CUstream primary_stream = nullptr;
  CHECK_OR_DIE(c.api.cuStreamCreate(&primary_stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  auto green_stream_create = reinterpret_cast<PFN_green_stream>(dlsym(c.rt.handle, "cuGreenCtxStreamCreate"));
  CHECK_OR_DIE(client::is_cudalloc(reinterpret_cast<void*>(green_stream_create)));
  CUstream green_stream = nullptr;
  CHECK_OR_DIE(green_stream_create(&green_stream, green, CU_STREAM_NON_BLOCKING, 0) == CUDA_SUCCESS);

  struct Case {
    const char* name;
    CUcontext owner, user;
    CUstream stream;
  };
  const Case cases[] = {
      {"primary block, green context's default stream", c.ctx, gctx, nullptr},
      {"green block, primary context's default stream", gctx, c.ctx, nullptr},
      {"green block, primary context's non-blocking stream", gctx, c.ctx, primary_stream},
      // A device fence must cover the green context's own streams too, whether it records one
      // event for the primary context or one per stream.
      {"primary block, green context's non-blocking stream", c.ctx, gctx, green_stream},
  };
  int failures = 0;
  for (const Case& k : cases) {
    bool reused = false;
    const std::size_t wrong = reuse_across(c, k.owner, k.user, k.stream, &reused);
    std::fprintf(stderr, "green_ctx: %s: reused %d, %zu of %zu bytes overwritten\n", k.name, reused, wrong, kBytes);
    failures += wrong != 0;
  }

  // A green context's block is the primary context's memory: it outlives the green context.
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(gctx) == CUDA_SUCCESS);
  CUdeviceptr kept = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&kept, 1 << 20) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuStreamDestroy_v2(green_stream) == CUDA_SUCCESS);
  CHECK_OR_DIE(destroy(green) == CUDA_SUCCESS);
  unsigned char byte = 0;
  CHECK_OR_DIE(c.api.cuMemsetD8_v2(kept, 7, 1 << 20) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemcpyDtoH_v2(&byte, kept + 12345, 1) == CUDA_SUCCESS);
  const CUresult freed = c.api.cuMemFree_v2(kept);
  std::fprintf(stderr, "green_ctx: after the green context's end: value %d, free %d\n", byte, static_cast<int>(freed));
  failures += byte != 7 || freed != CUDA_SUCCESS;
  CHECK_OR_DIE(c.api.cuStreamDestroy_v2(primary_stream) == CUDA_SUCCESS);
  return failures == 0 ? 0 : 1;
}
