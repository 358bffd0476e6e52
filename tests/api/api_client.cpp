// The C API (include/cudalloc/cudalloc.h) used as a program would, with libcudalloc.so
// preloaded over the fake driver, through the header's CUDALLOC_DYNAMIC wrappers.
//
//   api_client stats        figures move with allocations; peaks reset; the cache empties;
//                           the summary's length protocol; bad keys and devices are refused
//   api_client limit        a limit in bytes, then a fraction, bound the next allocation
//                           (CUDA_ERROR_OUT_OF_MEMORY), and lifting them lets it through; a
//                           fraction set on device 1 before it has an allocator holds there
//   api_client phases       (CUDALLOC_TRACE set, no trace_nvtx) phases pushed and popped; the
//                           trace, flushed on demand, has them in its records' nvtx= fields
//   api_client threads      API calls from one thread while others allocate and free
//   api_client passthrough  (CUDALLOC_NO_CACHING=1) every figure call says PASSTHROUGH
//   api_client absent       (not preloaded) every call says NOT_LOADED, none gives a figure
#define CUDALLOC_DYNAMIC
#include <cudalloc/cudalloc.h>

#include <atomic>
#include <map>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client.h"

namespace {

constexpr std::size_t kMiB = 1 << 20;

void ok(int status, const char* what) {
  if (status != CUDALLOC_OK) {
    client::die(std::string(what) + ": " + cudalloc_status_string(status) + " (" + std::to_string(status) + ")");
  }
}

int64_t stat(const char* key, int device = CUDALLOC_CURRENT_DEVICE) {
  int64_t v = -1;
  ok(cudalloc_stat(device, key, &v), key);
  return v;
}

std::string summary(int device) {
  size_t length = 0;
  ok(cudalloc_memory_summary(device, nullptr, 0, &length), "summary length");
  std::string s(length + 1, '\0');
  size_t again = 0;
  ok(cudalloc_memory_summary(device, s.data(), s.size(), &again), "summary");
  s.resize(std::strlen(s.c_str()));
  return s;
}

int stats() {
  client::Client& c = client::client();
  CHECK_OR_DIE(cudalloc_api_version() == CUDALLOC_API_VERSION);
  CHECK_OR_DIE(std::strlen(cudalloc_version()) >= 5);
  // The key set: PyTorch's names, each reachable by index.
  const size_t n = cudalloc_stat_count();
  CHECK_OR_DIE(n > 40);
  bool seen_alloc = false, seen_retries = false;
  for (size_t i = 0; i < n; ++i) {
    seen_alloc |= std::strcmp(cudalloc_stat_name(i), "allocated_bytes.all.current") == 0;
    seen_retries |= std::strcmp(cudalloc_stat_name(i), "num_alloc_retries") == 0;
  }
  CHECK_OR_DIE(seen_alloc && seen_retries && cudalloc_stat_name(n) == nullptr);

  const int64_t alloc0 = stat("allocated_bytes.all.current");
  const int64_t device_allocs0 = stat("num_device_alloc");
  CUdeviceptr a = 0, b = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&a, 30 * kMiB) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&b, 4000) == CUDA_SUCCESS);
  CHECK_OR_DIE(stat("allocated_bytes.all.current") == alloc0 + int64_t(30 * kMiB + 4096));
  CHECK_OR_DIE(stat("allocated_bytes.all.current", 0) == stat("allocated_bytes.all.current"));
  CHECK_OR_DIE(stat("allocated_bytes.large_pool.current") >= int64_t(30 * kMiB));
  CHECK_OR_DIE(stat("allocation.all.current") == 2);
  CHECK_OR_DIE(stat("reserved_bytes.all.current") >= int64_t(30 * kMiB + 2 * kMiB));
  CHECK_OR_DIE(stat("num_device_alloc") == device_allocs0 + 2);
  CHECK_OR_DIE(stat("num_ooms") == 0);
  // All of them at once agree with one at a time.
  std::vector<int64_t> all(n, -7);
  ok(cudalloc_stats(0, all.data(), all.size()), "stats");
  for (size_t i = 0; i < n; ++i) {
    if (std::strcmp(cudalloc_stat_name(i), "allocated_bytes.all.current") == 0) {
      CHECK_OR_DIE(all[i] == stat("allocated_bytes.all.current"));
    }
  }

  CHECK_OR_DIE(c.api.cuMemFree_v2(a) == CUDA_SUCCESS);
  CHECK_OR_DIE(stat("allocated_bytes.all.current") == alloc0 + 4096);
  CHECK_OR_DIE(stat("allocated_bytes.all.peak") >= int64_t(30 * kMiB + 4096));
  const int64_t reserved = stat("reserved_bytes.all.current");
  CHECK_OR_DIE(reserved >= int64_t(30 * kMiB));  // still cached

  ok(cudalloc_reset_peak_memory_stats(CUDALLOC_CURRENT_DEVICE), "reset peaks");
  CHECK_OR_DIE(stat("allocated_bytes.all.peak") == stat("allocated_bytes.all.current"));
  CHECK_OR_DIE(stat("reserved_bytes.all.peak") == reserved);

  const std::string s = summary(CUDALLOC_CURRENT_DEVICE);
  CHECK_OR_DIE(s.find("cudalloc memory summary, device 0") != std::string::npos);
  CHECK_OR_DIE(s.find("Allocated memory") != std::string::npos);
  // Too small a buffer: cut and NUL-terminated, with the full length.
  char small[16];
  size_t length = 0;
  ok(cudalloc_memory_summary(0, small, sizeof small, &length), "small summary");
  CHECK_OR_DIE(length == s.size() && std::strlen(small) == sizeof small - 1);

  const int64_t device_frees0 = stat("num_device_free");
  size_t released = 0;
  ok(cudalloc_empty_cache(CUDALLOC_ALL_DEVICES, &released), "empty cache");
  CHECK_OR_DIE(released >= 30 * kMiB);
  CHECK_OR_DIE(stat("reserved_bytes.all.current") == reserved - int64_t(released));
  CHECK_OR_DIE(stat("num_device_free") > device_frees0);
  CHECK_OR_DIE(stat("allocated_bytes.all.current") == alloc0 + 4096);  // the live block stays
  CHECK_OR_DIE(c.api.cuMemFree_v2(b) == CUDA_SUCCESS);

  int64_t v = 0;
  CHECK_OR_DIE(cudalloc_stat(0, "allocated_bytes.everything", &v) == CUDALLOC_ERROR_UNKNOWN_KEY);
  CHECK_OR_DIE(cudalloc_stat(7, "num_ooms", &v) == CUDALLOC_ERROR_INVALID_DEVICE);  // 1 fake device
  CHECK_OR_DIE(cudalloc_stat(-5, "num_ooms", &v) == CUDALLOC_ERROR_INVALID_DEVICE);
  CHECK_OR_DIE(cudalloc_stat(0, "num_ooms", nullptr) == CUDALLOC_ERROR_INVALID_VALUE);
  CHECK_OR_DIE(cudalloc_trace_flush() == CUDALLOC_ERROR_NOT_TRACING);
  CHECK_OR_DIE(cudalloc_phase_pop() == CUDALLOC_ERROR_NO_PHASE);
  std::printf("stats ok\n");
  return 0;
}

int limit() {
  client::Client& c = client::client();
  CUdeviceptr p = 0;
  ok(cudalloc_set_memory_limit(0, 64 * kMiB), "set limit");
  size_t bytes = 0;
  ok(cudalloc_get_memory_limit(0, &bytes), "get limit");
  CHECK_OR_DIE(bytes == 64 * kMiB);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 100 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_OR_DIE(stat("num_ooms") == 1);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 40 * kMiB) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  // The driver's figures follow the limit, as with memory_limit_mb.
  size_t free_b = 0, total_b = 0;
  CHECK_OR_DIE(c.api.cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS && total_b == 64 * kMiB);

  // A fraction: 2048 MiB of fake device, a quarter is 512 MiB; the 64 MiB cap still holds.
  ok(cudalloc_set_memory_fraction(0, 0.25), "set fraction");
  double f = 0;
  ok(cudalloc_get_memory_fraction(0, &f), "get fraction");
  CHECK_OR_DIE(f == 0.25);
  ok(cudalloc_get_memory_limit(0, &bytes), "get limit");
  CHECK_OR_DIE(bytes == 64 * kMiB);
  ok(cudalloc_set_memory_limit(0, 0), "no cap");
  ok(cudalloc_get_memory_limit(0, &bytes), "get limit");
  CHECK_OR_DIE(bytes == 512 * kMiB);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 600 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 400 * kMiB) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  ok(cudalloc_set_memory_fraction(0, 1.0), "whole device");
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 600 * kMiB) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK_OR_DIE(cudalloc_set_memory_fraction(0, 0.0) == CUDALLOC_ERROR_INVALID_VALUE);
  CHECK_OR_DIE(cudalloc_set_memory_fraction(0, 1.5) == CUDALLOC_ERROR_INVALID_VALUE);

  // Device 1 (FAKE_CUDA_DEVICES=2) has no allocator yet: the setting waits for it.
  ok(cudalloc_set_memory_fraction(1, 0.125), "fraction of device 1");  // 256 MiB
  ok(cudalloc_get_memory_limit(1, &bytes), "limit of device 1");
  CHECK_OR_DIE(bytes == 256 * kMiB);
  CUdevice dev1 = 0;
  CUcontext ctx1 = nullptr;
  CHECK_OR_DIE(c.api.cuDeviceGet(&dev1, 1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuDevicePrimaryCtxRetain(&ctx1, dev1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuCtxSetCurrent(ctx1) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 300 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_OR_DIE(stat("num_ooms", CUDALLOC_CURRENT_DEVICE) == 1);  // device 1's own
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 200 * kMiB) == CUDA_SUCCESS);
  CHECK_OR_DIE(stat("allocated_bytes.all.current", 1) == int64_t(200 * kMiB));
  CHECK_OR_DIE(stat("allocated_bytes.all.current", 0) == 0);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  std::printf("limit ok\n");
  return 0;
}

int phases() {
  client::Client& c = client::client();
  CUdeviceptr p = 0;
  ok(cudalloc_phase_push("forward"), "push forward");
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 1000) == CUDA_SUCCESS);  // nvtx=forward
  ok(cudalloc_phase_push("attn"), "push attn");
  CUdeviceptr q = 0;
  // From another thread, which has no NVTX range of its own: the process's phase.
  std::thread t([&] {
    CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&q, 3000) == CUDA_SUCCESS);  // nvtx=forward/attn
  });
  t.join();
  ok(cudalloc_phase_pop(), "pop attn");
  ok(cudalloc_phase_pop(), "pop forward");
  CHECK_OR_DIE(cudalloc_phase_pop() == CUDALLOC_ERROR_NO_PHASE);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);  // no phase
  CHECK_OR_DIE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
  ok(cudalloc_trace_flush(), "flush");
  char path[4096];
  size_t length = 0;
  ok(cudalloc_trace_path(path, sizeof path, &length), "trace path");
  CHECK_OR_DIE(length == std::strlen(path) && length > 0);
  // The flush put the records in the file while the process runs: read them back.
  std::FILE* f = std::fopen(path, "r");
  CHECK_OR_DIE(f != nullptr);
  std::map<std::string, std::string> seen;  // "event requested" -> extra
  char line[1024];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (line[0] == '#' || std::strncmp(line, "ts_ns", 5) == 0) continue;
    std::vector<std::string> cols;
    std::string cur;
    for (const char* q = line; *q != '\0' && *q != '\n'; ++q) {
      if (*q == ',') {
        cols.push_back(cur);
        cur.clear();
      } else {
        cur += *q;
      }
    }
    cols.push_back(cur);
    CHECK_OR_DIE(cols.size() == 14);
    seen[cols[4] + " " + cols[7]] = cols[13];
  }
  std::fclose(f);
  for (const auto& [k, v] : seen) std::printf("%s: %s\n", k.c_str(), v.c_str());
  CHECK_OR_DIE(seen.at("alloc 1000") == "nvtx=forward");
  CHECK_OR_DIE(seen.at("alloc 3000") == "nvtx=forward/attn");
  CHECK_OR_DIE(seen.at("free 1000").empty());
  CHECK_OR_DIE(seen.at("free 3000").empty());
  std::printf("phases ok\n");
  return 0;
}

int threads() {
  client::Client& c = client::client();
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&, t] {
      CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
      while (!stop.load()) {
        CUdeviceptr p = 0;
        CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, (t + 1) * 3 * kMiB) == CUDA_SUCCESS);
        CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
      }
    });
  }
  for (int i = 0; i < 300; ++i) {
    CHECK_OR_DIE(stat("allocated_bytes.all.current", 0) >= 0);
    CHECK_OR_DIE(!summary(0).empty());
    ok(cudalloc_empty_cache(0, nullptr), "empty cache");
    ok(cudalloc_reset_peak_memory_stats(CUDALLOC_ALL_DEVICES), "reset");
    ok(cudalloc_phase_push("p"), "push");
    ok(cudalloc_phase_pop(), "pop");
  }
  stop = true;
  for (auto& w : workers) w.join();
  CHECK_OR_DIE(stat("allocated_bytes.all.current", 0) == 0);
  CHECK_OR_DIE(stat("allocation.all.current", 0) == 0);
  std::printf("threads ok\n");
  return 0;
}

int passthrough() {
  client::Client& c = client::client();
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  int64_t v = 0;
  CHECK_OR_DIE(cudalloc_stat(0, "allocated_bytes.all.current", &v) == CUDALLOC_ERROR_PASSTHROUGH);
  size_t length = 0;
  CHECK_OR_DIE(cudalloc_memory_summary(0, nullptr, 0, &length) == CUDALLOC_ERROR_PASSTHROUGH);
  CHECK_OR_DIE(cudalloc_empty_cache(0, nullptr) == CUDALLOC_ERROR_PASSTHROUGH);
  CHECK_OR_DIE(cudalloc_set_memory_fraction(0, 0.5) == CUDALLOC_ERROR_PASSTHROUGH);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  std::printf("passthrough ok\n");
  return 0;
}

int absent() {
  int64_t v = 42;
  CHECK_OR_DIE(cudalloc_api_version() == 0 && cudalloc_version() == nullptr);
  CHECK_OR_DIE(cudalloc_stat(0, "allocated_bytes.all.current", &v) == CUDALLOC_ERROR_NOT_LOADED && v == 42);
  CHECK_OR_DIE(cudalloc_stat_count() == 0);
  size_t length = 7;
  CHECK_OR_DIE(cudalloc_memory_summary(0, nullptr, 0, &length) == CUDALLOC_ERROR_NOT_LOADED && length == 7);
  CHECK_OR_DIE(cudalloc_empty_cache(0, nullptr) == CUDALLOC_ERROR_NOT_LOADED);
  CHECK_OR_DIE(cudalloc_reset_peak_memory_stats(0) == CUDALLOC_ERROR_NOT_LOADED);
  CHECK_OR_DIE(cudalloc_set_memory_limit(0, 1) == CUDALLOC_ERROR_NOT_LOADED);
  CHECK_OR_DIE(cudalloc_phase_push("x") == CUDALLOC_ERROR_NOT_LOADED);
  CHECK_OR_DIE(std::strstr(cudalloc_status_string(CUDALLOC_ERROR_NOT_LOADED), "not loaded") != nullptr);
  std::printf("absent ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "stats") return stats();
  if (what == "limit") return limit();
  if (what == "phases") return phases();
  if (what == "threads") return threads();
  if (what == "passthrough") return passthrough();
  if (what == "absent") return absent();
  std::fprintf(stderr, "usage: api_client stats|limit|phases|threads|passthrough|absent\n");
  return 2;
}
