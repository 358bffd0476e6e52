// An unmodified NVTX-instrumented program (nvtx3 header-only) over the fake driver, for
// check_nvtx_phases.py. It prints what the trace must say, one line per allocation or free:
//   E <tid> <alloc|free> <ptr> <phase>     (phase "-" when no range is open)
// and `ENV <NVTX_INJECTION64_PATH as seen at start, or ->`.
//
//   nvtx_phases phases      ranges of every kind, nesting, two threads at once
//   nvtx_phases foreign     NVTX_INJECTION64_PATH names nvtx_other_injection: it gets the
//                           pushes, cudalloc records no phase (E lines say "-")
//   nvtx_phases none        no injection at all: every phase "-"
//   nvtx_phases no-cuda     NVTX only: the driver is never loaded and no thread started
#include <dlfcn.h>
#include <nvtx3/nvToolsExt.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client.h"

namespace {

bool g_phases = true;  // false: another injection owns NVTX, every expected phase is "-"
std::vector<CUdeviceptr> g_live;

long tid() { return ::syscall(SYS_gettid); }

void expect(const char* event, CUdeviceptr p, const char* phase) {
  std::printf("E %ld %s 0x%llx %s\n", tid(), event, static_cast<unsigned long long>(p),
              g_phases ? phase : "-");
}

CUdeviceptr alloc(std::size_t bytes, const char* phase) {
  client::Client& c = client::client();
  CUdeviceptr p = 0;
  CHECK_OR_DIE(c.api.cuMemAlloc_v2(&p, bytes) == CUDA_SUCCESS);
  expect("alloc", p, phase);
  return p;
}

void release(CUdeviceptr p, const char* phase) {
  CHECK_OR_DIE(client::client().api.cuMemFree_v2(p) == CUDA_SUCCESS);
  expect("free", p, phase);
}

void wait_for(const std::atomic<int>& flag) {
  while (flag.load() == 0) std::this_thread::yield();
}

int threads_now() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

int no_cuda() {
  nvtxRangePushA("forward");
  nvtxRangePushA("attn");
  nvtxRangePop();
  nvtxRangePop();
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/libcuda.so") != std::string::npos) {
      std::fprintf(stderr, "driver loaded: %s\n", line.c_str());
      return 7;
    }
  }
  if (threads_now() != 1) {
    std::fprintf(stderr, "threads: %d\n", threads_now());
    return 9;
  }
  return 0;
}

void phases() {
  client::client();
  g_live.push_back(alloc(3000, "-"));

  // Nested ranges on the default domain.
  const int forward_level = nvtxRangePushA("forward");
  CHECK_OR_DIE(!g_phases || forward_level == 0);
  g_live.push_back(alloc(5000, "forward"));
  const int attn_level = nvtxRangePushA("attn");
  CHECK_OR_DIE(!g_phases || attn_level == 1);
  CUdeviceptr a = alloc(7 << 20, "forward/attn");
  nvtxRangePop();
  release(a, "forward");

  // Another thread in its own range while this one stays in "forward".
  std::atomic<int> worker_in{0}, main_done{0}, worker_done{0};
  std::thread worker([&] {
    client::client().api.cuCtxSetCurrent(client::client().ctx);
    nvtxRangePushA("backward");
    worker_in.store(1);
    wait_for(main_done);
    CUdeviceptr w = alloc(9000, "backward");
    nvtxRangePushA("grad");
    CUdeviceptr g = alloc(3 << 20, "backward/grad");
    nvtxRangePop();
    release(g, "backward");
    release(w, "backward");
    nvtxRangePop();
    CUdeviceptr after = alloc(11000, "-");
    release(after, "-");
    worker_done.store(1);
  });
  wait_for(worker_in);
  CUdeviceptr m = alloc(6000, "forward");
  main_done.store(1);
  wait_for(worker_done);
  worker.join();
  release(m, "forward");
  nvtxRangePop();

  // nvtxRangePushEx with an ASCII message; PyTorch emit_nvtx's per-call suffixes dropped;
  // ',' and ';' made '_' by the writer.
  nvtxEventAttributes_t ea{};
  ea.version = NVTX_VERSION;
  ea.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  ea.messageType = NVTX_MESSAGE_TYPE_ASCII;
  ea.message.ascii = "step;1,x";
  nvtxRangePushEx(&ea);
  nvtxRangePushA("aten::mm, seq = 12, op_id = 40, sizes = [[2, 3], [3, 4]]");
  g_live.push_back(alloc(12000, "step_1_x/aten::mm"));
  nvtxRangePop();
  nvtxRangePushA("aten::mm, seq = 13, op_id = 41");  // the same phase as seq 12
  g_live.push_back(alloc(13000, "step_1_x/aten::mm"));
  nvtxRangePop();
  nvtxRangePop();

  // Wide strings, as UTF-8.
  nvtxRangePushW(L"d\u00e9codeur");
  g_live.push_back(alloc(14000, "d\xc3\xa9" "codeur"));
  ea.messageType = NVTX_MESSAGE_TYPE_UNICODE;
  ea.message.unicode = L"\u03b1";
  nvtxRangePushEx(&ea);
  g_live.push_back(alloc(15000, "d\xc3\xa9" "codeur/\xce\xb1"));
  nvtxRangePop();
  nvtxRangePop();

  // A domain and registered strings (ASCII and wide).
  nvtxDomainHandle_t dom = nvtxDomainCreateA("trainer");
  nvtxStringHandle_t opt = nvtxDomainRegisterStringA(dom, "optimizer");
  nvtxStringHandle_t sched = nvtxDomainRegisterStringW(dom, L"sched");
  nvtxEventAttributes_t ra{};
  ra.version = NVTX_VERSION;
  ra.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  ra.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  ra.message.registered = opt;
  nvtxDomainRangePushEx(dom, &ra);
  g_live.push_back(alloc(16000, "optimizer"));
  ra.message.registered = sched;
  nvtxDomainRangePushEx(dom, &ra);
  g_live.push_back(alloc(17000, "optimizer/sched"));
  nvtxDomainRangePop(dom);
  nvtxDomainRangePop(dom);

  // Domains pop independently: popping the default domain's range leaves the domain's open.
  nvtxRangePushA("outer");
  ra.message.registered = opt;
  nvtxDomainRangePushEx(dom, &ra);
  g_live.push_back(alloc(18000, "outer/optimizer"));
  nvtxRangePop();  // "outer" ends; "optimizer" (of `dom`) is still open
  g_live.push_back(alloc(19000, "optimizer"));
  nvtxDomainRangePop(dom);
  // The global domain of nvtx3's C++ API is the null domain: the same stack as nvtxRangePushA.
  nvtxDomainRangePushEx(nullptr, &ea);  // (the wide "α" message)
  g_live.push_back(alloc(20000, "\xce\xb1"));
  nvtxRangePop();

  // Deeper than the stored 64 levels: the text is cut at 64 bytes, and the pops still match.
  nvtxRangePushA("deep");
  for (int i = 0; i < 79; ++i) nvtxRangePushA("x");
  std::string deep = "deep";
  while (deep.size() < 64) deep += "/x";
  deep.resize(64);
  g_live.push_back(alloc(21000, deep.c_str()));
  for (int i = 0; i < 79; ++i) nvtxRangePop();
  g_live.push_back(alloc(22000, "deep"));
  nvtxRangePop();
  g_live.push_back(alloc(23000, "-"));
  const int extra_pop = nvtxRangePop();
  CHECK_OR_DIE(!g_phases || extra_pop < 0);  // nothing open: an error, not a crash

  for (CUdeviceptr p : g_live) release(p, "-");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "phases";
  const char* env = std::getenv("NVTX_INJECTION64_PATH");
  std::printf("ENV %s\n", env != nullptr ? env : "-");
  if (mode == "no-cuda") return no_cuda();
  if (mode == "none") {
    g_phases = false;  // trace_nvtx off, or no trace: NVTX calls are no-ops
    phases();
    return 0;
  }
  if (mode == "foreign") {
    g_phases = false;
    phases();
    // The other injection got the calls (NVTX loaded it; RTLD_NOLOAD finds that copy).
    void* other = env != nullptr ? dlopen(env, RTLD_NOW | RTLD_NOLOAD) : nullptr;
    auto pushes = other != nullptr
                      ? reinterpret_cast<int (*)()>(dlsym(other, "other_injection_pushes"))
                      : nullptr;
    CHECK_OR_DIE(pushes != nullptr);
    std::printf("OTHER_PUSHES %d\n", pushes());
    return 0;
  }
  phases();
  return 0;
}
