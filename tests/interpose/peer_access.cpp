// Peer access to memory cudalloc serves, two fake devices (FAKE_CUDA_DEVICES=2). The fake
// driver fails a kernel (fakecuda_launch_write) from a device that a virtual memory mapping in
// its range does not grant, as the GPU faults. Natively cudaMalloc memory is reachable from a
// peer once cuCtxEnablePeerAccess ran; expandable segments (virtual memory) must grant the peer
// with cuMemSetAccess, on what is mapped and on what is mapped later.
//
//   peer_access basic         blocks on device 0 before and after the enable, reached from device 1
//   peer_access enable_first  peer access enabled before device 0 has any memory of cudalloc's
//   peer_access race          device 0 grows its segments on another thread during the enable
//
// CUDALLOC_CONF picks plain segments, expandable_segments:true or page_stitching:true; with
// plain segments no access is ever set (cuMemSetAccess is not called) and nothing changes.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client.h"

using client::Client;

namespace {

constexpr std::size_t MiB = 1 << 20;
using EnablePeerFn = CUresult (*)(CUcontext, unsigned);

bool expandable() {
  const char* conf = std::getenv("CUDALLOC_CONF");
  return conf != nullptr && (std::strstr(conf, "expandable_segments:true") || std::strstr(conf, "page_stitching:true"));
}

CUcontext primary(Client& c, int ordinal) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CHECK_OR_DIE(c.api.cuDeviceGet(&dev, ordinal) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
  return ctx;
}

struct Block {
  CUdeviceptr ptr;
  std::size_t bytes;
};

Block alloc(Client& c, std::size_t bytes) {
  Block b{0, bytes};
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&b.ptr, bytes) == CUDA_SUCCESS);
  return b;
}

// A kernel of the current context (device 1) writes `value` over each block; the blocks must
// then hold it, read back in device 0's context. The number of blocks the kernel could not reach.
int write_from_peer(Client& c, CUcontext owner, const std::vector<Block>& blocks, unsigned char value) {
  std::vector<bool> launched;
  for (const Block& b : blocks) launched.push_back(c.launch_write(nullptr, b.ptr, b.bytes, value, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  CUcontext accessor = nullptr;
  CHECK_OR_DIE(c.api.cuCtxGetCurrent(&accessor) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(owner) == CUDA_SUCCESS);
  int refused = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    std::vector<unsigned char> h(blocks[i].bytes);
    CHECK_OR_DIE(c.api.cuMemcpyDtoH_v2(h.data(), blocks[i].ptr, blocks[i].bytes) == CUDA_SUCCESS);
    bool written = launched[i];
    for (std::size_t k = 0; written && k < h.size(); ++k) written = h[k] == value;
    refused += !written;
  }
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(accessor) == CUDA_SUCCESS);
  return refused;
}

EnablePeerFn enable_peer(Client& c) {
  auto fn = c.get<EnablePeerFn>("cuCtxEnablePeerAccess");
  CHECK_OR_DIE(fn != nullptr);
  CHECK_OR_DIE(client::is_cudalloc(reinterpret_cast<void*>(fn)));  // the runtime got the hook
  return fn;
}

int check(const char* what, int refused) {
  std::fprintf(stderr, "peer_access: %s: %d blocks not reachable from device 1\n", what, refused);
  return refused == 0 ? 0 : 1;
}

int basic(Client& c) {
  const EnablePeerFn enable = enable_peer(c);
  CUcontext ctx0 = c.ctx;
  CUcontext ctx1 = primary(c, 1);
  std::vector<Block> before{alloc(c, 4096), alloc(c, 300 * 1024), alloc(c, 6 * MiB), alloc(c, 24 * MiB)};
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  const int unreachable = write_from_peer(c, ctx0, before, 0x11);
  // The fake's check is live: expandable memory is not the peer's before the enable.
  if (expandable() && unreachable != static_cast<int>(before.size())) return check("before the enable", -1);
  c.reset_stats();
  CHECK_OR_DIE(enable(ctx0, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(enable(ctx0, 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  const std::uint64_t grants = c.snapshot().vm_set_access;
  int bad = write_from_peer(c, ctx0, before, 0x22);

  // New chunks mapped after the enable: small blocks past the first 2 MiB chunk, a large one
  // that needs a segment of its own, and for page stitching a growth at the peak that moves
  // the pages of a freed block (remap).
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx0) == CUDA_SUCCESS);
  std::vector<Block> after;
  for (int i = 0; i < 40; ++i) after.push_back(alloc(c, 100 * 1024));
  after.push_back(alloc(c, 48 * MiB));
  // In stream order, so that the freed block is free at once: [gone][kept] on the legacy
  // stream; then a cudaMalloc that grows its own segment at the peak takes gone's pages.
  const auto alloc_async = [&](std::size_t bytes) {
    Block b{0, bytes};
    CHECK_OR_DIE(c.api.cuMemAllocAsync(&b.ptr, bytes, nullptr) == CUDA_SUCCESS);
    return b;
  };
  const Block gone = alloc_async(40 * MiB);
  after.push_back(alloc_async(40 * MiB));
  CHECK_OR_DIE(c.api.cuMemFreeAsync(gone.ptr, nullptr) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  const std::uint64_t unmaps = c.snapshot().vm_unmap;
  after.push_back(alloc(c, 60 * MiB));
  const std::uint64_t moved = c.snapshot().vm_unmap - unmaps;
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  bad += write_from_peer(c, ctx0, after, 0x33);
  const auto s = c.snapshot();
  std::fprintf(stderr, "peer_access: %llu cuMemSetAccess at the enable, %llu in all, %llu pages unmapped by the growth\n",
               (unsigned long long)grants, (unsigned long long)s.vm_set_access, (unsigned long long)moved);
  if (!expandable() && s.vm_set_access != 0) return check("plain segments set access", -1);
  const char* conf = std::getenv("CUDALLOC_CONF");
  if (conf != nullptr && std::strstr(conf, "page_stitching:true") && moved == 0) return check("no page moved", -1);
  return check("basic", bad);
}

int enable_first(Client& c) {
  const EnablePeerFn enable = enable_peer(c);
  CUcontext ctx0 = c.ctx;
  CUcontext ctx1 = primary(c, 1);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  CHECK_OR_DIE(enable(ctx0, 0) == CUDA_SUCCESS);  // device 0 has no allocator yet
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx0) == CUDA_SUCCESS);
  std::vector<Block> blocks{alloc(c, 4096), alloc(c, 6 * MiB), alloc(c, 30 * MiB)};
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  return check("enable_first", write_from_peer(c, ctx0, blocks, 0x44));
}

// Maps made by another thread while the grant runs: each is either granted by it or made with
// the peer in its access list.
int race(Client& c) {
  const EnablePeerFn enable = enable_peer(c);
  CUcontext ctx0 = c.ctx;
  CUcontext ctx1 = primary(c, 1);
  int bad = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<Block> blocks;
    std::thread grower([&] {
      CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx0) == CUDA_SUCCESS);
      for (int i = 0; i < 48; ++i) blocks.push_back(alloc(c, (i % 3 + 1) * 3 * MiB));
    });
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
    if (round == 0) CHECK_OR_DIE(enable(ctx0, 0) == CUDA_SUCCESS);
    grower.join();
    bad += write_from_peer(c, ctx0, blocks, static_cast<unsigned char>(0x50 + round));
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx0) == CUDA_SUCCESS);
    for (const Block& b : blocks) CHECK_OR_DIE(c.api.cuMemFree_v2(b.ptr) == CUDA_SUCCESS);
    // Everything idle given back: the next round maps again, with the peer listed.
    CUmemoryPool pool = nullptr;
    CHECK_OR_DIE(client::default_pool_trim(c, &pool)(pool, 0) == CUDA_SUCCESS);
  }
  return check("race", bad);
}

}  // namespace

int main(int argc, char** argv) {
  Client& c = client::client();
  const std::string what = argc > 1 ? argv[1] : "basic";
  if (what == "basic") return basic(c);
  if (what == "enable_first") return enable_first(c);
  if (what == "race") return race(c);
  client::die("unknown scenario " + what);
}
