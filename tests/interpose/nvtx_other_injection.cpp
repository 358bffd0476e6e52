// Another NVTX injection (as compute-sanitizer's or Nsight's would be): NVTX_INJECTION64_PATH
// names it before cudalloc loads, so cudalloc must leave the variable alone. It counts pushes.
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <atomic>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {
std::atomic<int> g_pushes{0};
int NVTX_API push_a(const char*) { return g_pushes.fetch_add(1); }
int NVTX_API pop() { return 0; }
}  // namespace

EXPORT int other_injection_pushes() { return g_pushes.load(); }

EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  auto* cb = static_cast<const NvtxExportTableCallbacks*>(get(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable core = nullptr;
  unsigned size = 0;
  if (cb == nullptr || cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &size) == 0) return 0;
  *core[NVTX_CBID_CORE_RangePushA] = reinterpret_cast<NvtxFunctionPointer>(&push_a);
  *core[NVTX_CBID_CORE_RangePop] = reinterpret_cast<NvtxFunctionPointer>(&pop);
  return 1;
}
