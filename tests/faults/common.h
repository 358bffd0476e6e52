// Helpers shared by the fault-injection and bad-input tests (cudalloc preloaded over the fake
// driver; see tests/interpose/client.h for how a test gets the runtime's driver table).
#pragma once

#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "client.h"

namespace faults {

using client::Client;

inline fakecuda_clear_failures_fn clear_failures() {
  static auto fn = reinterpret_cast<fakecuda_clear_failures_fn>(dlsym(client::client().rt.handle,
                                                                      "fakecuda_clear_failures"));
  return fn;
}

inline CUstream make_stream(Client& c, unsigned flags) {
  CUstream s = nullptr;
  REQUIRE(c.api.cuStreamCreate(&s, flags) == CUDA_SUCCESS);
  return s;
}

// Fake device memory is host memory: read it directly (after the streams that write it are
// synchronized by the caller).
inline bool all_equal(CUdeviceptr p, std::size_t n, unsigned char v) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != v) return false;
  }
  return true;
}

// A live block with a known pattern: checked before and after a fault to show the cache kept it.
struct Sentinel {
  Client& c;
  CUdeviceptr p = 0;
  std::size_t n;
  unsigned char v;
  Sentinel(Client& cl, std::size_t bytes, unsigned char value) : c(cl), n(bytes), v(value) {
    REQUIRE(c.api.cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    REQUIRE(c.api.cuMemsetD8_v2(p, v, n) == CUDA_SUCCESS);
  }
  bool intact() const {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    return c.api.cuMemGetAddressRange_v2(&base, &size, p) == CUDA_SUCCESS && base == p && size >= n &&
           all_equal(p, n, v);
  }
  ~Sentinel() {
    if (p != 0) CHECK(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  }
};

}  // namespace faults
