// Soak test: many threads and streams doing random allocate / write / verify / free work
// through cudalloc (preloaded) on the fake driver, for SOAK_SECONDS (default 20).
//
// Every block's owner fills it with its own byte pattern (cuMemsetD8 on the legacy stream, a
// fake kernel on its own stream, or a direct store: fake device memory is host memory) and
// verifies it before freeing. Before some frees the owner queues a *delayed* write of the same
// pattern on a non-blocking stream and frees at once (cuMemFree, or cuMemFreeAsync on that
// stream or on another one): if cudalloc handed the block to someone else before that write
// ran, the new owner's pattern is overwritten and its check fails. At the end every block is
// freed and cuMemGetInfo must count all of cudalloc's memory as free again (nothing lost).
//
// Prints one line of figures; exit 0 if nothing was corrupted or lost, 1 otherwise.
// Environment: SOAK_SECONDS, SOAK_THREADS (default 8), SOAK_SEED.
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client.h"

namespace {

using client::Client;

struct Block {
  CUdeviceptr p = 0;
  std::size_t n = 0;
  unsigned char v = 0;
  CUstream written_on = nullptr;  // stream of a pending async write (synchronized before checks)
};

struct Totals {
  std::atomic<std::uint64_t> ops{0}, allocs{0}, frees{0}, async_frees{0}, cross_frees{0}, delayed_writes{0};
  std::atomic<std::uint64_t> bytes{0}, checks{0}, checked_bytes{0}, ooms{0}, corrupted{0}, errors{0};
};

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

// Checks the whole block when small, else 64 KiB at each end and 8 random 4 KiB windows.
bool verify(const Block& b, std::mt19937_64& rng, Totals& t) {
  const auto* base = reinterpret_cast<const unsigned char*>(b.p);
  auto range_ok = [&](std::size_t off, std::size_t len) {
    len = std::min(len, b.n - off);
    t.checked_bytes += len;
    for (std::size_t i = 0; i < len; ++i) {
      if (base[off + i] != b.v) return false;
    }
    return true;
  };
  t.checks++;
  if (b.n <= 256 * 1024) return range_ok(0, b.n);
  bool ok = range_ok(0, 64 * 1024) && range_ok(b.n - 64 * 1024, 64 * 1024);
  for (int i = 0; ok && i < 8; ++i) ok = range_ok(rng() % (b.n - 4096), 4096);
  return ok;
}

std::size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0: case 1: case 2: case 3: return 1 + rng() % 4096;
    case 4: case 5: case 6: return 4096 + rng() % (1 << 20);
    case 7: case 8: return (1 << 20) + rng() % (6 << 20);
    default: return (6 << 20) + rng() % (24 << 20);
  }
}

void worker(int id, Client& c, const std::vector<CUstream>& shared, double seconds, std::uint64_t seed, Totals& t) {
  if (c.api.cuCtxSetCurrent(c.ctx) != CUDA_SUCCESS) {
    t.errors++;
    return;
  }
  std::mt19937_64 rng(seed * 7919 + static_cast<std::uint64_t>(id));
  CUstream own = nullptr;
  if (c.api.cuStreamCreate(&own, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    t.errors++;
    return;
  }
  std::vector<Block> live;
  unsigned counter = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto fail = [&](const char* what, CUresult r) {
    t.errors++;
    std::fprintf(stderr, "soak: thread %d: %s returned %d\n", id, what, static_cast<int>(r));
  };
  auto release = [&](Block b) {
    if (b.written_on != nullptr) c.api.cuStreamSynchronize(b.written_on);
    if (!verify(b, rng, t)) {
      t.corrupted++;
      std::fprintf(stderr, "soak: thread %d: block 0x%llx (%zu B, pattern 0x%02x) corrupted\n", id,
                   static_cast<unsigned long long>(b.p), b.n, b.v);
    }
    CUresult r = CUDA_SUCCESS;
    const unsigned how = rng() % 8;
    if (how < 3) {
      // A late write of the owner's own pattern, then the free at once: the block must not be
      // reused before the write ran.
      const CUstream s = how == 0 ? own : shared[rng() % shared.size()];
      if (c.launch_write(s, b.p, std::min<std::size_t>(b.n, 1 << 20), b.v, 200 + rng() % 3000) != CUDA_SUCCESS) {
        fail("fakecuda_launch_write", CUDA_ERROR_UNKNOWN);
      }
      t.delayed_writes++;
      if (how == 0) {
        r = c.api.cuMemFreeAsync(b.p, own);
        t.async_frees++;
      } else if (how == 1) {
        // Stream-ordered after the write (the stream the write went to), which is not the
        // stream the block was allocated on: a cross-stream free.
        r = c.api.cuMemFreeAsync(b.p, s);
        t.cross_frees++;
      } else {
        r = c.api.cuMemFree_v2(b.p);
      }
    } else if (how < 5) {
      r = c.api.cuMemFreeAsync(b.p, how == 3 ? own : shared[rng() % shared.size()]);
      t.async_frees++;
    } else {
      r = c.api.cuMemFree_v2(b.p);
    }
    if (r != CUDA_SUCCESS) fail("free", r);
    t.frees++;
  };

  while (std::chrono::steady_clock::now() < end) {
    t.ops++;
    const unsigned op = rng() % 100;
    if (op < 50 && live.size() < 24) {
      Block b;
      b.n = random_size(rng);
      b.v = static_cast<unsigned char>(1 + (id * 37 + ++counter) % 255);
      const bool async = rng() % 2 == 0;
      const CUresult r = async ? c.api.cuMemAllocAsync(&b.p, b.n, own) : c.api.cuMemAlloc_v2(&b.p, b.n);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        t.ooms++;
        continue;
      }
      if (r != CUDA_SUCCESS) {
        fail("alloc", r);
        continue;
      }
      t.allocs++;
      t.bytes += b.n;
      switch (rng() % 3) {
        case 0: {
          // The legacy stream is not ordered after the non-blocking `own`: an async block
          // (which may have been reused in `own`'s order) is only usable there after a sync.
          if (async) c.api.cuStreamSynchronize(own);
          const CUresult w = c.api.cuMemsetD8_v2(b.p, b.v, b.n);  // synchronous
          if (w != CUDA_SUCCESS) fail("cuMemsetD8", w);
          break;
        }
        case 1:
          // A kernel on the owner's stream: an async allocation is ordered on that stream; a
          // cudaMalloc'd one is usable on any stream.
          if (c.launch_write(own, b.p, b.n, b.v, 0) != CUDA_SUCCESS) fail("launch_write", CUDA_ERROR_UNKNOWN);
          b.written_on = own;
          break;
        default:
          if (async) c.api.cuStreamSynchronize(own);  // host stores are not stream ordered
          std::memset(reinterpret_cast<void*>(b.p), b.v, b.n);
          break;
      }
      live.push_back(b);
    } else if (op < 90 && !live.empty()) {
      const std::size_t i = rng() % live.size();
      const Block b = live[i];
      live[i] = live.back();
      live.pop_back();
      release(b);
    } else if (op < 95 && !live.empty()) {
      Block& b = live[rng() % live.size()];  // re-check a live block
      if (b.written_on != nullptr) c.api.cuStreamSynchronize(b.written_on);
      b.written_on = nullptr;
      if (!verify(b, rng, t)) {
        t.corrupted++;
        std::fprintf(stderr, "soak: thread %d: live block 0x%llx corrupted\n", id, static_cast<unsigned long long>(b.p));
      }
    } else {
      c.api.cuStreamSynchronize(shared[rng() % shared.size()]);
    }
  }
  while (!live.empty()) {
    release(live.back());
    live.pop_back();
  }
  c.api.cuStreamSynchronize(own);
  c.api.cuStreamDestroy_v2(own);
}

}  // namespace

int main() {
  Client& c = client::client();
  const double seconds = static_cast<double>(env_size("SOAK_SECONDS", 20));
  const int threads = static_cast<int>(env_size("SOAK_THREADS", 8));
  const std::uint64_t seed = env_size("SOAK_SEED", static_cast<std::size_t>(std::random_device{}()));
  std::vector<CUstream> shared(4, nullptr);
  for (std::size_t i = 0; i < shared.size(); ++i) {
    if (c.api.cuStreamCreate(&shared[i], i % 2 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT) != CUDA_SUCCESS) {
      std::fprintf(stderr, "soak: cuStreamCreate failed\n");
      return 1;
    }
  }
  Totals t;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker, i, std::ref(c), std::cref(shared), seconds, seed, std::ref(t));
  for (auto& th : pool) th.join();
  for (CUstream s : shared) c.api.cuStreamSynchronize(s);
  c.api.cuCtxSynchronize();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Nothing lost: every block is free again, so all of cudalloc's memory counts as free.
  std::size_t free_bytes = 0, total = 0;
  std::uint64_t lost = 0;
  if (c.api.cuMemGetInfo_v2(&free_bytes, &total) != CUDA_SUCCESS) {
    t.errors++;
  } else if (free_bytes != total) {
    lost = total - free_bytes;
  }
  for (CUstream s : shared) c.api.cuStreamDestroy_v2(s);
  const auto st = c.snapshot();
  std::printf("soak: %d threads, %zu shared + %d own streams, %.1f s, seed %" PRIu64 ": %" PRIu64 " ops, %" PRIu64
              " allocs (%.2f GiB), %" PRIu64 " frees (%" PRIu64 " async, %" PRIu64 " on a shared stream, %" PRIu64
              " behind a delayed write), %" PRIu64 " checks (%.2f GiB verified), %" PRIu64 " OOM, driver: %" PRIu64
              " cuMemAlloc %" PRIu64 " cuMemFree %" PRIu64 " cuMemMap; corrupted: %" PRIu64 ", lost bytes: %" PRIu64
              ", errors: %" PRIu64 "\n",
              threads, shared.size(), threads, took, seed, t.ops.load(), t.allocs.load(),
              static_cast<double>(t.bytes.load()) / (1 << 30), t.frees.load(), t.async_frees.load(),
              t.cross_frees.load(), t.delayed_writes.load(), t.checks.load(),
              static_cast<double>(t.checked_bytes.load()) / (1 << 30), t.ooms.load(), st.mem_alloc, st.mem_free,
              st.vm_map, t.corrupted.load(), lost, t.errors.load());
  return t.corrupted == 0 && lost == 0 && t.errors == 0 && t.frees == t.allocs ? 0 : 1;
}
