// An IPC handle for a block whose previous owner's device work is still queued: the importing
// process is ordered behind none of this process's streams, so the export waits for that work
// before it returns the handle. Otherwise the old owner's late write lands on the importer's data.
//   ipc_reuse free  IPC_CHILD   cudaFree'd, then reused (run with single_stream:true, where
//                               reuse follows the legacy stream's order and no fence is recorded)
//   ipc_reuse async IPC_CHILD   freed and reused in one non-blocking stream's order
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "client.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const bool async = std::strcmp(argv[1], "async") == 0;
  client::Client& c = client::client();
  const std::size_t n = 24 << 20;  // a segment of its own: exportable
  CUstream s = nullptr;
  if (async) CHECK_OR_DIE(c.api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK_OR_DIE((async ? c.api.cuMemAllocAsync(&p, n, s) : c.api.cuMemAlloc_v2(&p, n)) == CUDA_SUCCESS);
  // The old owner's write runs 500 ms from now.
  CHECK_OR_DIE(c.launch_write(s, p, n, 0xAA, 500000) == CUDA_SUCCESS);
  CHECK_OR_DIE((async ? c.api.cuMemFreeAsync(p, s) : c.api.cuMemFree_v2(p)) == CUDA_SUCCESS);
  CUdeviceptr q = 0;
  CHECK_OR_DIE((async ? c.api.cuMemAllocAsync(&q, n, s) : c.api.cuMemAlloc_v2(&q, n)) == CUDA_SUCCESS);
  if (q != p) {
    std::fprintf(stderr, "ipc_reuse: the block was not reused; nothing to check\n");
    return 1;  // the scenario needs the reuse
  }
  CUipcMemHandle h{};
  CHECK_OR_DIE(c.api.cuIpcGetMemHandle(&h, q) == CUDA_SUCCESS);
  const std::string hex = client::to_hex(h);
  const pid_t pid = fork();
  if (pid == 0) {  // the importer: finds the old owner's bytes (its write is done), writes 0x22
    unsetenv("LD_PRELOAD");
    execl(argv[2], argv[2], hex.c_str(), std::to_string(n).c_str(), "170", "34", static_cast<char*>(nullptr));
    _exit(99);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK_OR_DIE(c.api.cuCtxSynchronize() == CUDA_SUCCESS);
  std::vector<unsigned char> host(n);
  CHECK_OR_DIE(c.api.cuMemcpyDtoH_v2(host.data(), q, n) == CUDA_SUCCESS);
  std::size_t bad = 0;
  for (unsigned char x : host) bad += x != 0x22;
  std::fprintf(stderr, "ipc_reuse %s: importer exit %d, %zu of %zu bytes not the importer's\n", argv[1],
               WIFEXITED(status) ? WEXITSTATUS(status) : -1, bad, n);
  return bad == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
