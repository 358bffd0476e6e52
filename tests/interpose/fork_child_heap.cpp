// cudalloc's fork handlers make no heap call in the child. Another parent thread may have held
// the allocator's lock at the fork; glibc's malloc resets it before the child's handlers run,
// but other allocators (ASan's, for one) do not, and the child then hangs. The child's fresh
// state is made at its first call instead. This program's malloc counts calls made in a fork
// child before fork() has returned there, that is from a fork handler. (Its own malloc is why
// the sanitizer stages leave it out.) With the argument "fresh_thread" the fork is made by a
// thread that has made no CUDA call, so has no thread cache of cudalloc's yet.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "client.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {
std::atomic<bool> g_forking{false};
std::atomic<int> g_parent{0};
std::atomic<int> g_handler_calls{0};

void check() {
  if (g_forking.load(std::memory_order_relaxed) && ::getpid() != g_parent.load(std::memory_order_relaxed)) {
    g_handler_calls.fetch_add(1, std::memory_order_relaxed);
  }
}
}  // namespace

extern "C" void* malloc(size_t n) {
  check();
  return __libc_malloc(n);
}
extern "C" void* calloc(size_t n, size_t size) {
  check();
  return __libc_calloc(n, size);
}
extern "C" void* realloc(void* p, size_t n) {
  check();
  return __libc_realloc(p, n);
}
extern "C" void* aligned_alloc(size_t align, size_t n) {
  check();
  return __libc_memalign(align, n);
}
extern "C" int posix_memalign(void** out, size_t align, size_t n) {
  check();
  *out = __libc_memalign(align, n);
  return *out != nullptr ? 0 : 12;  // ENOMEM
}

// In the child, on the thread that forked: the first call makes the child's state; the driver
// refuses the child, as natively.
[[noreturn]] void child(client::Client& c, CUdeviceptr p) {
  const int calls = g_handler_calls.load();
  g_forking = false;
  alarm(10);
  CUdeviceptr r = 0;
  const CUresult a = c.api.cuMemAlloc_v2(&r, 4096);
  const CUresult f = c.api.cuMemFree_v2(p);
  std::fprintf(stderr, "fork_child_heap: %d heap calls from fork handlers; child alloc %d, free of the parent's "
               "block %d\n", calls, static_cast<int>(a), static_cast<int>(f));
  _exit(calls == 0 && a != CUDA_SUCCESS && f != CUDA_SUCCESS ? 0 : 3);
}

int main(int argc, char** argv) {
  const bool fresh_thread = argc > 1 && std::strcmp(argv[1], "fresh_thread") == 0;
  client::Client& c = client::client();
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);  // cudalloc's state exists
  CUdeviceptr q = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&q, 4096) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuMemFree_v2(q) == CUDA_SUCCESS);
  g_parent = static_cast<int>(::getpid());
  pid_t pid = -1;
  auto fork_here = [&] {
    g_forking = true;
    pid = fork();
    if (pid == 0) child(c, p);
  };
  if (fresh_thread) {
    std::thread(fork_here).join();
  } else {
    fork_here();
  }
  g_forking = false;
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "child failed: status %d\n", status);
    return 1;
  }
  CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
  return 0;
}
