// IPC of blocks of expandable segments (driver/ipc_export.h, driver/ipc_import.h), one
// scenario per process, under CUDALLOC_CONF=expandable_segments:true or page_stitching:true.
// The exporter's block is never at its segment's start, and starts inside a chunk.
//   ipc_expandable share        an importer with cudalloc reads the pattern and writes its own
//   ipc_expandable no_preload   an importer without cudalloc gets an error, soon
//   ipc_expandable freed        a handle of a block freed since: the importer gets an error
//   ipc_expandable gone         the exporting process has exited: an error, soon
//   ipc_expandable fork         a fork child of the exporter does not serve, nor stop the
//                               parent's serving; an importer it starts is served by the parent
//   ipc_expandable refused      chunks the driver will not make exportable
//                               (FAKE_CUDA_NO_FD_EXPORT=1): cuIpcGetMemHandle fails, clearly
// The importer is this program again:
//   ipc_expandable import HEX SIZE EXPECTED NEW    opens twice, checks, writes, closes twice
//   ipc_expandable import_fails HEX                the open fails within 3 seconds
//   ipc_expandable export_and_exit                 prints a handle, exits
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client.h"

namespace {

using client::to_hex;

constexpr std::size_t kMiB = 1 << 20;
constexpr std::size_t kFirst = 3 * kMiB;  // so that the block starts in the middle of a 2 MiB chunk
constexpr std::size_t kSize = 7 * kMiB;   // over four chunks, or pages

using Open = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int);
using Close = CUresult (*)(CUdeviceptr);

CUipcMemHandle from_hex(const char* hex) {
  CUipcMemHandle h{};
  CHECK_OR_DIE(std::strlen(hex) == 2 * CU_IPC_HANDLE_SIZE);
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i) {
    unsigned v = 0;
    CHECK_OR_DIE(std::sscanf(hex + 2 * i, "%2x", &v) == 1);
    h.reserved[i] = static_cast<char>(v);
  }
  return h;
}

// Runs this program with `args`; with cudalloc preloaded or not. Its exit status.
int run_self(const std::vector<std::string>& args, bool preload) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (!preload) unsetenv("LD_PRELOAD");
    std::vector<char*> argv{const_cast<char*>("/proc/self/exe")};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(99);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool all_bytes(client::Client& c, CUdeviceptr p, std::size_t n, unsigned char v) {
  std::vector<unsigned char> host(n);
  if (c.api.cuMemcpyDtoH_v2(host.data(), p, n) != CUDA_SUCCESS) return false;
  for (unsigned char x : host) {
    if (x != v) return false;
  }
  return true;
}

struct Blocks {
  CUdeviceptr first = 0;
  CUdeviceptr block = 0;
};

// Two blocks of one expandable segment: the second is the one to share, filled with 0x5A.
Blocks make_blocks(client::Client& c) {
  Blocks b;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&b.first, kFirst) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&b.block, kSize) == CUDA_SUCCESS);
  CHECK_OR_DIE(b.block == b.first + kFirst);  // inside the segment, not at its start
  CHECK_OR_DIE(c.api.cuMemsetD8_v2(b.first, 0x11, kFirst) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemsetD8_v2(b.block, 0x5A, kSize) == CUDA_SUCCESS);
  return b;
}

CUipcMemHandle export_handle(client::Client& c, CUdeviceptr p) {
  CUipcMemHandle h{};
  CHECK_OR_DIE(c.api.cuIpcGetMemHandle(&h, p) == CUDA_SUCCESS);
  return h;
}

// The importer with cudalloc: the block's bytes, then its own.
int import(client::Client& c, const char* hex, std::size_t size, int expected, int fresh) {
  const CUipcMemHandle h = from_hex(hex);
  auto open = client::proc<Open>(c, "cuIpcOpenMemHandle", 11000);
  auto close = client::proc<Close>(c, "cuIpcCloseMemHandle", 4010);
  CUdeviceptr p = 0;
  CHECK_OR_DIE(open(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS && p != 0);
  CUdeviceptr again = 0;
  CHECK_OR_DIE(open(&again, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  CHECK_OR_DIE(again == p);  // one mapping, counted twice
  CHECK_OR_DIE(all_bytes(c, p, size, static_cast<unsigned char>(expected)));
  CHECK_OR_DIE(c.api.cuMemsetD8_v2(p, static_cast<unsigned char>(fresh), size) == CUDA_SUCCESS);
  CHECK_OR_DIE(close(p) == CUDA_SUCCESS);
  CHECK_OR_DIE(all_bytes(c, p, size, static_cast<unsigned char>(fresh)));  // still open once
  CHECK_OR_DIE(close(p) == CUDA_SUCCESS);
  CHECK_OR_DIE(close(p) != CUDA_SUCCESS);  // closed for good
  return 0;
}

// The open fails, with an error rather than a hang.
int import_fails(client::Client& c, const char* hex) {
  const CUipcMemHandle h = from_hex(hex);
  auto open = client::proc<Open>(c, "cuIpcOpenMemHandle", 11000);
  const auto start = std::chrono::steady_clock::now();
  CUdeviceptr p = 0;
  const CUresult r = open(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "import_fails: error %d after %.2f s\n", static_cast<int>(r), s);
  return r == CUDA_ERROR_INVALID_VALUE && s < 3 ? 0 : 1;
}

int share(client::Client& c) {
  const Blocks b = make_blocks(c);
  const CUipcMemHandle h = export_handle(c, b.block);
  const CUipcMemHandle twice = export_handle(c, b.block);
  CHECK_OR_DIE(std::memcmp(&h, &twice, sizeof h) == 0);  // one export per block
  const CUipcMemHandle inner = export_handle(c, b.block + 4096);  // a pointer inside names the block
  CHECK_OR_DIE(std::memcmp(&h, &inner, sizeof h) == 0);
  CHECK_OR_DIE(run_self({"import", to_hex(h), std::to_string(kSize), "90", "60"}, true) == 0);
  CHECK_OR_DIE(all_bytes(c, b.block, kSize, 60));   // the importer's write
  CHECK_OR_DIE(all_bytes(c, b.first, kFirst, 0x11));  // and nothing beside the block
  // A second importer, after the first closed its mapping.
  CHECK_OR_DIE(run_self({"import", to_hex(h), std::to_string(kSize), "60", "61"}, true) == 0);
  CHECK_OR_DIE(all_bytes(c, b.block, kSize, 61));
  CHECK_OR_DIE(c.api.cuMemFree_v2(b.block) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(b.first) == CUDA_SUCCESS);
  return 0;
}

int no_preload(client::Client& c) {
  const Blocks b = make_blocks(c);
  const CUipcMemHandle h = export_handle(c, b.block);
  CHECK_OR_DIE(run_self({"import_fails", to_hex(h)}, false) == 0);
  CHECK_OR_DIE(all_bytes(c, b.block, kSize, 0x5A));
  return 0;
}

int freed(client::Client& c) {
  const Blocks b = make_blocks(c);
  const CUipcMemHandle h = export_handle(c, b.block);
  CHECK_OR_DIE(c.api.cuMemFree_v2(b.block) == CUDA_SUCCESS);
  CHECK_OR_DIE(run_self({"import_fails", to_hex(h)}, true) == 0);
  // Freed and handed out again at the same address (in one stream's order, reused at once):
  // the new block is not the one the old handle named, and has a handle of its own.
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&p, kSize, nullptr) == CUDA_SUCCESS);
  const CUipcMemHandle old = export_handle(c, p);
  CHECK_OR_DIE(c.api.cuMemFreeAsync(p, nullptr) == CUDA_SUCCESS);
  CUdeviceptr again = 0;
  CHECK_OR_DIE(c.api.cuMemAllocAsync(&again, kSize, nullptr) == CUDA_SUCCESS);
  CHECK_OR_DIE(again == p);
  CHECK_OR_DIE(run_self({"import_fails", to_hex(old)}, true) == 0);
  const CUipcMemHandle fresh = export_handle(c, again);
  CHECK_OR_DIE(std::memcmp(&old, &fresh, sizeof old) != 0);
  CHECK_OR_DIE(c.api.cuMemsetD8_v2(again, 7, kSize) == CUDA_SUCCESS);
  CHECK_OR_DIE(run_self({"import", to_hex(fresh), std::to_string(kSize), "7", "8"}, true) == 0);
  return 0;
}

int export_and_exit(client::Client& c) {
  const Blocks b = make_blocks(c);
  std::printf("%s\n", to_hex(export_handle(c, b.block)).c_str());
  return 0;  // exit() with the server's thread waiting for connections
}

// The exporter exits; this process, with cudalloc, is the importer.
int gone(client::Client& c) {
  int pipefd[2];
  CHECK_OR_DIE(pipe(pipefd) == 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    execl("/proc/self/exe", "/proc/self/exe", "export_and_exit", static_cast<char*>(nullptr));
    _exit(99);
  }
  close(pipefd[1]);
  char hex[2 * CU_IPC_HANDLE_SIZE + 2] = {};
  std::size_t got = 0;
  for (ssize_t k = 0; got < sizeof hex - 1 && (k = read(pipefd[0], hex + got, sizeof hex - 1 - got)) > 0;) got += k;
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK_OR_DIE(WIFEXITED(status) && WEXITSTATUS(status) == 0);  // it exited, and at once
  CHECK_OR_DIE(got == sizeof hex - 1);
  hex[2 * CU_IPC_HANDLE_SIZE] = '\0';
  return import_fails(c, hex);
}

int fork_exporter(client::Client& c) {
  const Blocks b = make_blocks(c);
  const CUipcMemHandle h = export_handle(c, b.block);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    CUipcMemHandle mine{};
    // CUDA is not usable in a fork child: an error, and no server of its own under any name.
    CHECK_OR_DIE(c.api.cuIpcGetMemHandle(&mine, b.block) != CUDA_SUCCESS);
    const int r = run_self({"import", to_hex(h), std::to_string(kSize), "90", "33"}, true);
    std::exit(r);  // exit(), not _exit(): its exit handlers must leave the parent's socket alone
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK_OR_DIE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_OR_DIE(all_bytes(c, b.block, kSize, 33));
  // The parent still serves after its child's exit.
  CHECK_OR_DIE(run_self({"import", to_hex(h), std::to_string(kSize), "33", "34"}, true) == 0);
  CHECK_OR_DIE(all_bytes(c, b.block, kSize, 34));
  return 0;
}

int refused(client::Client& c) {
  const Blocks b = make_blocks(c);  // expandable segments still work, with plain chunks
  CUipcMemHandle h{};
  CHECK_OR_DIE(c.api.cuIpcGetMemHandle(&h, b.block) == CUDA_ERROR_INVALID_VALUE);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string what = argv[1];
  client::Client& c = client::client();
  if (what == "import" && argc == 6) return import(c, argv[2], std::stoull(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (what == "import_fails" && argc == 3) return import_fails(c, argv[2]);
  if (what == "export_and_exit") return export_and_exit(c);
  if (what == "share") return share(c);
  if (what == "no_preload") return no_preload(c);
  if (what == "freed") return freed(c);
  if (what == "gone") return gone(c);
  if (what == "fork") return fork_exporter(c);
  if (what == "refused") return refused(c);
  return 2;
}
