// The program's own virtual memory (cuMemAddressReserve + cuMemCreate + cuMemMap +
// cuMemSetAccess ... cuMemUnmap + cuMemRelease + cuMemAddressFree, as XLA makes every buffer
// without its BFC pool) served from cudalloc's cache of mapped pairs, through the fake driver,
// one scenario per process:
//   loop         an XLA-like loop over a few sizes: after warm-up no VMM call reaches the
//                driver, and each buffer holds what was written to it
//   create_first the same with cuMemCreate before cuMemAddressReserve
//   queued       a buffer freed while a delayed write to it is queued: the next buffer of its
//                size is not that pair (the write would clobber it)
//   oom          a real cuMemCreate out of memory: the cached pairs go back and it succeeds
//   oom_own      cudalloc's own allocation (cudaMalloc) out of memory: the same
//   retain       cuMemRetainAllocationHandle on a cached pair's buffer: the real handle, and
//                the releases balance
//   not_plain    POSIX-descriptor handles served; exported handles and fixed addresses: every
//                call reaches the driver
//   passthrough  (CUDALLOC_NO_CACHING=1) every call reaches the driver
#include <unistd.h>
#include <cstring>
#include <string>
#include <vector>

#include "client.h"

using client::Client;
using client::proc;

namespace {

constexpr std::size_t MiB = 1024 * 1024;

using ReserveFn = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
using AddressFreeFn = CUresult (*)(CUdeviceptr, size_t);
using CreateFn = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
using ReleaseFn = CUresult (*)(CUmemGenericAllocationHandle);
using MapFn = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
using UnmapFn = CUresult (*)(CUdeviceptr, size_t);
using SetAccessFn = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
using RetainFn = CUresult (*)(CUmemGenericAllocationHandle*, void*);
using ExportFn = CUresult (*)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long);

struct Buffer {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;
  std::size_t size = 0;
};

struct Vmm {
  Client& c;
  ReserveFn reserve = proc<ReserveFn>(c, "cuMemAddressReserve", 12000);
  AddressFreeFn address_free = proc<AddressFreeFn>(c, "cuMemAddressFree", 12000);
  CreateFn create = proc<CreateFn>(c, "cuMemCreate", 12000);
  ReleaseFn release = proc<ReleaseFn>(c, "cuMemRelease", 12000);
  MapFn map = proc<MapFn>(c, "cuMemMap", 12000);
  UnmapFn unmap = proc<UnmapFn>(c, "cuMemUnmap", 12000);
  SetAccessFn set_access = proc<SetAccessFn>(c, "cuMemSetAccess", 12000);
  RetainFn retain = proc<RetainFn>(c, "cuMemRetainAllocationHandle", 12000);
  ExportFn export_handle = proc<ExportFn>(c, "cuMemExportToShareableHandle", 10020);
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};

  explicit Vmm(Client& cl) : c(cl) {
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  Buffer get(std::size_t size, bool create_first = false) {
    Buffer b;
    b.size = size;
    if (create_first) CHECK_OR_DIE(create(&b.handle, size, &prop, 0) == CUDA_SUCCESS);
    CHECK_OR_DIE(reserve(&b.va, size, 0, 0, 0) == CUDA_SUCCESS);
    if (!create_first) CHECK_OR_DIE(create(&b.handle, size, &prop, 0) == CUDA_SUCCESS);
    CHECK_OR_DIE(map(b.va, size, 0, b.handle, 0) == CUDA_SUCCESS);
    CHECK_OR_DIE(set_access(b.va, size, &access, 1) == CUDA_SUCCESS);
    return b;
  }
  void put(const Buffer& b) {
    CHECK_OR_DIE(unmap(b.va, b.size) == CUDA_SUCCESS);
    CHECK_OR_DIE(release(b.handle) == CUDA_SUCCESS);
    CHECK_OR_DIE(address_free(b.va, b.size) == CUDA_SUCCESS);
  }
};

std::uint64_t vmm_calls(const fakecuda_stats_t& s) {
  return s.vm_reserve + s.vm_address_free + s.vm_create + s.vm_release + s.vm_map + s.vm_unmap + s.vm_set_access;
}

// Whether [p, p + n) holds `value` in every byte.
bool holds(CUdeviceptr p, std::size_t n, unsigned char value) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != value) return false;
  }
  return true;
}

int loop(Client& c, bool create_first) {
  Vmm v(c);
  CHECK_OR_DIE(client::is_cudalloc(reinterpret_cast<const void*>(v.create)));
  CHECK_OR_DIE(client::is_cudalloc(reinterpret_cast<const void*>(v.map)));
  const std::size_t sizes[] = {2 * MiB, 4 * MiB, 2 * MiB, 8 * MiB};
  auto step = [&](int round) {
    std::vector<Buffer> live;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      live.push_back(v.get(sizes[i], create_first));
      const auto value = static_cast<unsigned char>(round * 7 + i);
      CHECK_OR_DIE(c.launch_write(nullptr, live.back().va, sizes[i], value, 0) == CUDA_SUCCESS);
    }
    CHECK_OR_DIE(c.api.cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
    for (std::size_t i = 0; i < live.size(); ++i) {
      CHECK_OR_DIE(holds(live[i].va, live[i].size, static_cast<unsigned char>(round * 7 + i)));
    }
    for (const Buffer& b : live) v.put(b);
  };
  for (int round = 0; round < 3; ++round) step(round);
  c.reset_stats();
  constexpr int kRounds = 200;
  for (int round = 0; round < kRounds; ++round) step(round);
  const fakecuda_stats_t s = c.snapshot();
  if (vmm_calls(s) != 0) {
    std::fprintf(stderr, "after warm-up, %llu virtual memory calls reached the driver for %d buffers\n",
                 static_cast<unsigned long long>(vmm_calls(s)), kRounds * 4);
    return 1;
  }
  return 0;
}

int queued(Client& c) {
  Vmm v(c);
  CUstream s = nullptr;
  CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  // Warm: a pair of the size is cached and ready.
  v.put(v.get(2 * MiB));
  Buffer a = v.get(2 * MiB);
  // The device writes 0xAA into a after a while; the program frees a before that runs.
  CHECK_OR_DIE(c.launch_write(s, a.va, a.size, 0xAA, 300 * 1000) == CUDA_SUCCESS);
  v.put(a);
  Buffer b = v.get(2 * MiB);
  std::memset(reinterpret_cast<void*>(b.va), 0x55, b.size);
  CHECK_OR_DIE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
  if (!holds(b.va, b.size, 0x55)) {
    std::fprintf(stderr, "the new buffer was clobbered by work queued on the freed one\n");
    return 1;
  }
  v.put(b);
  // Once the device is done, a's pair serves again.
  Buffer again = v.get(2 * MiB);
  v.put(again);
  return 0;
}

// 1.5 GiB of the fake's 2 GiB in cached pairs, then 1 GiB more: of another size through
// cuMemCreate, or through cudaMalloc (`own`).
int oom(Client& c, bool own) {
  Vmm v(c);
  std::vector<Buffer> live;
  for (int i = 0; i < 6; ++i) live.push_back(v.get(256 * MiB));
  for (const Buffer& b : live) v.put(b);
  CHECK_OR_DIE(c.snapshot().live_vm_handles == 6);
  c.reset_stats();
  if (own) {
    CUdeviceptr p = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 1024 * MiB) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  } else {
    Buffer big = v.get(1024 * MiB);
    CHECK_OR_DIE(c.snapshot().vm_create == 2);  // refused, then done
    v.put(big);
  }
  const fakecuda_stats_t s = c.snapshot();
  CHECK_OR_DIE(s.vm_release == 6 && s.vm_unmap == 6 && s.vm_address_free == 6);
  return 0;
}

int retain(Client& c) {
  Vmm v(c);
  v.put(v.get(2 * MiB));
  Buffer b = v.get(2 * MiB);  // a cached pair, lent
  CUmemGenericAllocationHandle h = 0;
  CHECK_OR_DIE(v.retain(&h, reinterpret_cast<void*>(b.va + 4096)) == CUDA_SUCCESS);
  CHECK_OR_DIE(h == b.handle);
  CHECK_OR_DIE(v.release(h) == CUDA_SUCCESS);
  v.put(b);
  // The pair went back to the program's own state at the retain: all of it is the driver's now.
  const fakecuda_stats_t s = c.snapshot();
  CHECK_OR_DIE(s.live_vm_handles == 0);
  return 0;
}

int not_plain(Client& c) {
  Vmm v(c);
  CHECK_OR_DIE(client::is_cudalloc(reinterpret_cast<const void*>(v.export_handle)));
  v.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // as XLA and NCCL ask
  constexpr int kRounds = 20;
  // Shareable handles never exported (XLA's buffers) are served, from pairs of their own kind.
  for (int i = 0; i < 3; ++i) v.put(v.get(2 * MiB));
  c.reset_stats();
  for (int i = 0; i < kRounds; ++i) v.put(v.get(2 * MiB));
  fakecuda_stats_t s = c.snapshot();
  CHECK_OR_DIE(s.vm_create == 0 && s.vm_release == 0 && s.vm_map == 0 && s.vm_unmap == 0);
  // Exported (NCCL hands its buffers to its peers): another process may map the handle, so it
  // never serves again; every buffer is the driver's.
  auto exported = [&] {
    Buffer b = v.get(2 * MiB);
    int fd = -1;
    CHECK_OR_DIE(v.export_handle(&fd, b.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
    close(fd);
    v.put(b);
  };
  exported();  // the pairs cached so far went to exports, or stay; what counts is the steady state
  for (int i = 0; i < 3; ++i) exported();
  c.reset_stats();
  for (int i = 0; i < kRounds; ++i) exported();
  s = c.snapshot();
  CHECK_OR_DIE(s.vm_create == kRounds && s.vm_release == kRounds && s.vm_map == kRounds && s.vm_unmap == kRounds);
  // A plain handle in a range reserved at a fixed address: the range is the driver's.
  v.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  CUdeviceptr hint = 0;
  CHECK_OR_DIE(v.reserve(&hint, 4 * MiB, 0, 0, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(v.address_free(hint, 4 * MiB) == CUDA_SUCCESS);
  c.reset_stats();
  for (int i = 0; i < kRounds; ++i) {
    CUdeviceptr va = 0;
    CHECK_OR_DIE(v.reserve(&va, 4 * MiB, 0, hint, 0) == CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = 0;
    CHECK_OR_DIE(v.create(&h, 4 * MiB, &v.prop, 0) == CUDA_SUCCESS);
    CHECK_OR_DIE(v.map(va, 4 * MiB, 0, h, 0) == CUDA_SUCCESS);
    v.put(Buffer{va, h, 4 * MiB});
  }
  s = c.snapshot();
  CHECK_OR_DIE(s.vm_reserve == kRounds && s.vm_address_free == kRounds && s.vm_map == kRounds);
  CHECK_OR_DIE(c.snapshot().live_vm_handles == 0);
  return 0;
}

int passthrough(Client& c) {
  Vmm v(c);
  constexpr int kRounds = 20;
  for (int i = 0; i < kRounds; ++i) v.put(v.get(2 * MiB));
  const fakecuda_stats_t s = c.snapshot();
  CHECK_OR_DIE(s.vm_create == kRounds && s.vm_reserve == kRounds && s.vm_map == kRounds &&
               s.vm_set_access == kRounds && s.vm_unmap == kRounds && s.vm_release == kRounds &&
               s.vm_address_free == kRounds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "loop";
  Client& c = client::client();
  if (scenario == "loop") return loop(c, false);
  if (scenario == "create_first") return loop(c, true);
  if (scenario == "queued") return queued(c);
  if (scenario == "oom") return oom(c, false);
  if (scenario == "oom_own") return oom(c, true);
  if (scenario == "retain") return retain(c);
  if (scenario == "not_plain") return not_plain(c);
  if (scenario == "passthrough") return passthrough(c);
  client::die("unknown scenario " + scenario);
}
