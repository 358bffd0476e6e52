// Kernel speed on memory from cuMemAlloc against memory mapped through the virtual-memory
// calls in chunks of several sizes, one cuMemCreate handle per chunk, as an expandable segment
// maps it. Tells whether the chunk size of expandable segments costs kernels time (TLB reach).
//   vmm_access [--gib N] [--reps R]
// Prints one line per (layout, kernel): the median kernel time in microseconds.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

#include "common.h"  // CHECK_CUDA (tests/gpu)

#define CHECK_DRV(x)                                                            \
  do {                                                                          \
    CUresult r_ = (x);                                                          \
    if (r_ != CUDA_SUCCESS) {                                                   \
      const char* s_ = nullptr;                                                 \
      cuGetErrorString(r_, &s_);                                                \
      std::fprintf(stderr, "%s: %s\n", #x, s_ ? s_ : "?");                      \
      std::exit(3);                                                             \
    }                                                                           \
  } while (0)

// Streams the first half of the buffer into the second half.
__global__ void copy_half(const float4* in, float4* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = in[i];
}

// Reads one 4-byte word at a hashed position per access, anywhere in the buffer: every access
// is likely a TLB miss where pages are small.
__global__ void gather(const unsigned* in, size_t words, size_t accesses, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < accesses; i += size_t(gridDim.x) * blockDim.x) {
    unsigned long long h = (i + 1) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    acc += in[h % words];
  }
  if (acc == 0xFFFFFFFFu) *sink = acc;
}

// Reads 2 KiB runs, each at a hashed position (a matmul tile's rows in a large tensor).
__global__ void tiles(const float4* in, size_t vecs, size_t runs, float* sink) {
  float acc = 0;
  const size_t per_run = 128;  // float4s: 2 KiB
  for (size_t r = blockIdx.x; r < runs; r += gridDim.x) {
    unsigned long long h = (r + 1) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    size_t base = (h % (vecs / per_run)) * per_run;
    float4 v = in[base + threadIdx.x % per_run];
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == -1.2345f) *sink = acc;
}

struct Layout {
  std::string name;
  CUdeviceptr base = 0;
  size_t bytes = 0;
  size_t chunk = 0;  // 0: cuMemAlloc
  std::vector<CUmemGenericAllocationHandle> handles;
};

static Layout make_alloc(size_t bytes) {
  Layout l{"cuMemAlloc", 0, bytes, 0, {}};
  CHECK_DRV(cuMemAlloc(&l.base, bytes));
  return l;
}

static Layout make_vmm(size_t bytes, size_t chunk, int dev) {
  Layout l{"vmm chunk " + std::to_string(chunk >> 20) + " MiB", 0, bytes, chunk, {}};
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  CHECK_DRV(cuMemAddressReserve(&l.base, bytes, 0, 0, 0));
  for (size_t off = 0; off < bytes; off += chunk) {
    CUmemGenericAllocationHandle h;
    CHECK_DRV(cuMemCreate(&h, chunk, &prop, 0));
    CHECK_DRV(cuMemMap(l.base + off, chunk, 0, h, 0));
    l.handles.push_back(h);
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  // One access call per chunk, as expandable segments set it as they grow.
  for (size_t off = 0; off < bytes; off += chunk) CHECK_DRV(cuMemSetAccess(l.base + off, chunk, &access, 1));
  return l;
}

static void destroy(Layout& l) {
  if (l.chunk == 0) {
    CHECK_DRV(cuMemFree(l.base));
    return;
  }
  for (size_t i = 0; i < l.handles.size(); ++i) {
    CHECK_DRV(cuMemUnmap(l.base + i * l.chunk, l.chunk));
    CHECK_DRV(cuMemRelease(l.handles[i]));
  }
  CHECK_DRV(cuMemAddressFree(l.base, l.bytes));
}

template <typename Launch>
static float median_us(int reps, Launch launch) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  launch();  // warm
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    launch();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000);
  }
  std::sort(t.begin(), t.end());
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  size_t gib = 4;
  int reps = 15;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--gib") && i + 1 < argc) gib = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: vmm_access [--gib N] [--reps R]\n");
      return 2;
    }
  }
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(nullptr));
  int dev = 0;
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t bytes = gib << 30;
  unsigned* sink;
  CHECK_CUDA(cudaMalloc(&sink, 64));
  std::vector<size_t> chunks = {size_t(2) << 20, size_t(20) << 20, size_t(64) << 20, size_t(512) << 20, bytes};
  std::printf("buffer %zu GiB, %d reps, median us\n", gib, reps);
  for (int pass = 0; pass < 2; ++pass) {  // two passes: the order of layouts is not the cause
    for (int k = -1; k < int(chunks.size()); ++k) {
      Layout l = k < 0 ? make_alloc(bytes) : make_vmm(bytes, chunks[k], dev);
      CHECK_CUDA(cudaMemset(reinterpret_cast<void*>(l.base), 1, bytes));
      const size_t vecs = bytes / 2 / sizeof(float4);
      float t_copy = median_us(reps, [&] {
        copy_half<<<sms * 8, 256>>>(reinterpret_cast<const float4*>(l.base),
                                    reinterpret_cast<float4*>(l.base + bytes / 2), vecs);
      });
      float t_gather = median_us(reps, [&] {
        gather<<<sms * 8, 256>>>(reinterpret_cast<const unsigned*>(l.base), bytes / 4, size_t(1) << 26, sink);
      });
      float t_tiles = median_us(reps, [&] {
        tiles<<<sms * 8, 128>>>(reinterpret_cast<const float4*>(l.base), bytes / sizeof(float4), size_t(1) << 20,
                               reinterpret_cast<float*>(sink));
      });
      CHECK_CUDA(cudaGetLastError());
      std::printf("pass %d  %-20s copy %9.1f  gather %9.1f  tiles %9.1f\n", pass, l.name.c_str(), t_copy, t_gather,
                  t_tiles);
      std::fflush(stdout);
      destroy(l);
    }
  }
  return 0;
}
