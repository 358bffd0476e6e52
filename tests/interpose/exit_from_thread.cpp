// exit() from one thread while others allocate and free: static destructors run, the driver
// starts answering CUDA_ERROR_DEINITIALIZED, and nothing may crash or hang.
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "client.h"

int main() {
  client::Client& c = client::client();
  alarm(20);
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&c, t] {
      c.api.cuCtxSetCurrent(c.ctx);
      CUstream s = nullptr;
      c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
      for (;;) {
        CUdeviceptr p = 0, q = 0;
        if (c.api.cuMemAlloc_v2(&p, 4096 << t) == CUDA_SUCCESS) c.api.cuMemFree_v2(p);
        if (c.api.cuMemAllocAsync(&q, 8192 << t, s) == CUDA_SUCCESS) c.api.cuMemFreeAsync(q, s);
      }
    });
  }
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::exit(0);
  }).join();
  return 1;  // not reached
}
