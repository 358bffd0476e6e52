// A fork child starts with a clean state: it cannot use CUDA (the driver says so), but
// nothing of the parent's cache is used, and nothing hangs on a lock another thread held,
// neither while it runs nor when it ends with exit(), which runs the forking thread's
// thread_local destructors (this thread has a thread cache of the parent's allocator).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "client.h"

int main() {
  client::Client& c = client::client();
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  CUdeviceptr cached = 0;  // a pair through this thread's cache
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&cached, 4096) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(cached) == CUDA_SUCCESS);
  // Another thread keeps allocating while we fork, so locks may be held at that moment: small
  // pairs (its thread cache) and large ones, which take the device lock each time.
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    c.api.cuCtxSetCurrent(c.ctx);
    for (unsigned i = 0; !stop.load(); ++i) {
      CUdeviceptr q = 0;
      if (c.api.cuMemAlloc_v2(&q, i % 2 ? 8192 : 24u << 20) == CUDA_SUCCESS) c.api.cuMemFree_v2(q);
    }
  });
  for (int round = 0; round < 40; ++round) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(10);  // a hang fails the test instead of stalling it
      CUdeviceptr q = 0;
      const CUresult a = c.api.cuMemAlloc_v2(&q, 4096);
      const CUresult f = c.api.cuMemFree_v2(p);  // the parent's block: not ours any more
      size_t fr = 0, total = 0;
      c.api.cuMemGetInfo_v2(&fr, &total);
      const int code = a != CUDA_SUCCESS && f != CUDA_SUCCESS ? 0 : 3;
      if (round % 2) std::exit(code);
      _exit(code);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "child failed: status %d\n", status);
      stop = true;
      busy.join();
      return 1;
    }
  }
  stop = true;
  busy.join();
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);  // the parent goes on as before
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  return 0;
}
