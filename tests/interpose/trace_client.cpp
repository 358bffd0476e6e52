// A traced program over the fake driver, for check_trace_stress.py. It prints what the trace must
// hold, one line per allocation or free (printed after the work, so printing does not pace it):
//   E <tid> <alloc|free> <ptr> <stream|->     in the thread's call order
//
//   trace_client threads N PAIRS ASYNC    N threads at once, each PAIRS cuMemAlloc/cuMemFree and
//                                         ASYNC cuMemAllocAsync/cuMemFreeAsync on its own stream
//   trace_client overflow N PAIRS         the writer thread held back (see hold_writer_back), then
//                                         this thread and N others each PAIRS pairs: the lanes
//                                         fill up and the rest is dropped, deterministically
//   trace_client hold PAIRS               PAIRS pairs, `READY <pid>`, waits for a line on stdin,
//                                         PAIRS more pairs (processes tracing at once)
//   trace_client loop PAIRS               PAIRS pairs, `READY <pid>`, then a pair a millisecond
//                                         until killed
//   trace_client stacks                   allocations from two call sites (trace_stacks)
#include <dirent.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client.h"

namespace {

long tid() { return ::syscall(SYS_gettid); }

struct Call {
  bool alloc;
  CUdeviceptr ptr;
  CUstream stream;  // null for cuMemAlloc/cuMemFree (the trace's "-")
  bool async;
};

// One thread's calls, printed once the work is done.
struct Log {
  long tid = 0;
  std::vector<Call> calls;
  void print() const {
    for (const Call& c : calls) {
      char stream[32] = "-";
      if (c.async) std::snprintf(stream, sizeof stream, "0x%llx", (unsigned long long)(uintptr_t)c.stream);
      std::printf("E %ld %s 0x%llx %s\n", tid, c.alloc ? "alloc" : "free", (unsigned long long)c.ptr, stream);
    }
  }
};

constexpr std::size_t kSizes[] = {512, 4096, 20000, 300000, 1 << 20, 3 << 20};
constexpr std::size_t kWindow = 4;  // blocks a thread keeps live at once: frees are not all LIFO

// `pairs` allocations of varied sizes, each freed kWindow allocations later; all freed at the end.
void work(Log& log, std::size_t pairs, CUstream stream, bool async) {
  client::Client& c = client::client();
  std::vector<CUdeviceptr> live;
  auto release = [&] {
    const CUdeviceptr p = live.front();
    live.erase(live.begin());
    CHECK_OR_DIE((async ? c.api.cuMemFreeAsync(p, stream) : c.api.cuMemFree_v2(p)) == CUDA_SUCCESS);
    log.calls.push_back({false, p, stream, async});
  };
  for (std::size_t i = 0; i < pairs; ++i) {
    if (live.size() == kWindow) release();
    CUdeviceptr p = 0;
    const std::size_t bytes = kSizes[(i * 7 + log.tid) % (sizeof kSizes / sizeof kSizes[0])];
    CHECK_OR_DIE((async ? c.api.cuMemAllocAsync(&p, bytes, stream) : c.api.cuMemAlloc_v2(&p, bytes)) ==
                 CUDA_SUCCESS);
    log.calls.push_back({true, p, stream, async});
    live.push_back(p);
  }
  while (!live.empty()) release();
}

// One size, allocated and freed at once: after the first pair every allocation is a cache hit,
// so the only records are the thread's alloc and free records (and its first segment).
void pairs_same_size(Log& log, std::size_t pairs) {
  client::Client& c = client::client();
  for (std::size_t i = 0; i < pairs; ++i) {
    CUdeviceptr p = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    log.calls.push_back({true, p, nullptr, false});
    CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
    log.calls.push_back({false, p, nullptr, false});
  }
}

CUstream make_stream() {
  CUstream s = nullptr;
  CHECK_OR_DIE(client::client().api.cuStreamCreate(&s, 0) == CUDA_SUCCESS);
  return s;
}

int threads(int n, std::size_t pairs, std::size_t async_pairs) {
  client::Client& c = client::client();
  std::vector<Log> logs(n);
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t) {
    ts.emplace_back([&, t] {
      CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
      Log& log = logs[t];
      log.tid = tid();
      const CUstream s = make_stream();
      // Interleaved, so a thread's sync and async records alternate in its lane.
      for (std::size_t done = 0; done < pairs || done < async_pairs; done += 500) {
        if (done < pairs) work(log, std::min<std::size_t>(500, pairs - done), nullptr, false);
        if (done < async_pairs) work(log, std::min<std::size_t>(500, async_pairs - done), s, true);
      }
      CHECK_OR_DIE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
    });
  }
  for (auto& t : ts) t.join();
  for (const Log& l : logs) l.print();
  return 0;
}

bool writer_thread_running() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) client::die("cannot list /proc/self/task");
  bool found = false;
  while (dirent* e = readdir(d)) {
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    if (std::getline(comm, name) && name == "cudalloc-trace") found = true;
  }
  closedir(d);
  return found;
}

// The writer thread starts on the first record; when it cannot be created, records stay in the
// lanes until the exit handler writes them (TraceWriter::start_thread). A default thread stack
// larger than the address space makes that one pthread_create fail, so no lane is drained
// before exit: each keeps exactly ring_capacity records and counts the rest as dropped, however
// the threads are scheduled. The fake driver's legacy-stream thread is started first, and the
// default is restored straight after, so no other thread is refused.
void hold_writer_back(Log& log) {
  client::Client& c = client::client();
  CUevent ev = nullptr;  // starts the legacy stream's worker thread
  CHECK_OR_DIE(c.api.cuEventCreate(&ev, 0) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuEventRecord(ev, nullptr) == CUDA_SUCCESS);
  CHECK_OR_DIE(c.api.cuEventSynchronize(ev) == CUDA_SUCCESS);
  CUdeviceptr scratch = 0;
  pthread_attr_t saved, huge;
  CHECK_OR_DIE(pthread_getattr_default_np(&saved) == 0);
  CHECK_OR_DIE(pthread_attr_init(&huge) == 0);
  CHECK_OR_DIE(pthread_attr_setstacksize(&huge, std::size_t{1} << 50) == 0);
  CHECK_OR_DIE(pthread_setattr_default_np(&huge) == 0);
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&scratch, 4096) == CUDA_SUCCESS);  // the first record
  log.calls.push_back({true, scratch, nullptr, false});
  CHECK_OR_DIE(pthread_setattr_default_np(&saved) == 0);
  pthread_attr_destroy(&huge);
  pthread_attr_destroy(&saved);
  if (writer_thread_running()) client::die("the trace writer thread started: cannot hold it back");
  CHECK_OR_DIE(c.api.cuMemFree_v2(scratch) == CUDA_SUCCESS);
  log.calls.push_back({false, scratch, nullptr, false});
}

int overflow(int n, std::size_t pairs) {
  client::Client& c = client::client();
  std::vector<Log> logs(n + 1);
  logs[0].tid = tid();
  hold_writer_back(logs[0]);
  pairs_same_size(logs[0], pairs);
  std::vector<std::thread> ts;
  for (int t = 1; t <= n; ++t) {
    ts.emplace_back([&, t] {
      CHECK_OR_DIE(c.api.cuCtxSetCurrent(c.ctx) == CUDA_SUCCESS);
      logs[t].tid = tid();
      pairs_same_size(logs[t], pairs);
    });
  }
  for (auto& t : ts) t.join();
  if (writer_thread_running()) client::die("the trace writer thread started late");
  for (const Log& l : logs) l.print();
  return 0;
}

// Prints READY once this process's trace is open and has records; the checker starts the others
// meanwhile, so that all of them hold their file at once.
void ready() {
  std::printf("READY %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
}

int hold(std::size_t pairs) {
  Log log;
  log.tid = tid();
  work(log, pairs, nullptr, false);
  ready();
  char line[16];
  if (std::fgets(line, sizeof line, stdin) == nullptr) client::die("no go line");
  work(log, pairs, nullptr, false);
  log.print();
  return 0;
}

int loop(std::size_t pairs) {
  Log log;
  log.tid = tid();
  work(log, pairs, nullptr, false);
  ready();
  client::Client& c = client::client();
  for (int i = 0; i < 60000; ++i) {  // a minute at most: the checker kills it long before
    CUdeviceptr p = 0;
    CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, kSizes[i % 6]) == CUDA_SUCCESS);
    CHECK_OR_DIE(c.api.cuMemFree_v2(p) == CUDA_SUCCESS);
    usleep(1000);
  }
  return 3;
}

// Two call sites, kept apart in the stacks by noinline.
__attribute__((noinline)) CUdeviceptr site_a(Log& log) {
  CUdeviceptr p = 0;
  CHECK_OR_DIE(client::client().api.cuMemAlloc_v2(&p, 1 << 20) == CUDA_SUCCESS);
  log.calls.push_back({true, p, nullptr, false});
  return p;
}

__attribute__((noinline)) CUdeviceptr site_b(Log& log, CUstream s) {
  CUdeviceptr p = 0;
  CHECK_OR_DIE(client::client().api.cuMemAllocAsync(&p, 8192, s) == CUDA_SUCCESS);
  log.calls.push_back({true, p, s, true});
  return p;
}

int stacks() {
  client::Client& c = client::client();
  Log log;
  log.tid = tid();
  const CUstream s = make_stream();
  for (int i = 0; i < 20; ++i) {
    const CUdeviceptr a = site_a(log);
    const CUdeviceptr b = site_b(log, s);
    CHECK_OR_DIE(c.api.cuMemFreeAsync(b, s) == CUDA_SUCCESS);
    log.calls.push_back({false, b, s, true});
    CHECK_OR_DIE(c.api.cuMemFree_v2(a) == CUDA_SUCCESS);
    log.calls.push_back({false, a, nullptr, false});
  }
  CHECK_OR_DIE(c.api.cuStreamSynchronize(s) == CUDA_SUCCESS);
  log.print();
  return 0;
}

std::size_t arg(int argc, char** argv, int i, std::size_t fallback) {
  return argc > i ? std::strtoull(argv[i], nullptr, 10) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  client::client();
  if (mode == "threads") return threads(arg(argc, argv, 2, 8), arg(argc, argv, 3, 4000), arg(argc, argv, 4, 2000));
  if (mode == "overflow") return overflow(arg(argc, argv, 2, 2), arg(argc, argv, 3, 20000));
  if (mode == "hold") return hold(arg(argc, argv, 2, 2000));
  if (mode == "loop") return loop(arg(argc, argv, 2, 5000));
  if (mode == "stacks") return stacks();
  std::fprintf(stderr, "usage: trace_client threads|overflow|hold|loop|stacks [N] [PAIRS] [ASYNC]\n");
  return 2;
}
