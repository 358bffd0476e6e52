// A fake NVTX injection library: what NVTX_INJECTION64_PATH names under compute-sanitizer,
// reduced to the calls cudalloc's nvtx mode makes. NVTX's loader calls
// InitializeInjectionNvtx2 (core: we take nvtxDomainCreateA) and, at the first memory-extension
// call, InitializeInjectionNvtxExtension with the module's function slots, which we fill. Every
// call is checked (domain, struct fields, regions inside a live heap, no overlaps, unregistering
// only what is registered) and optionally logged to FAKE_NVTX_LOG.
#define NVTX_NO_IMPL
#include <dlfcn.h>
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "fake_nvtx.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct Heap {
  size_t size;
};
struct Region {
  size_t size;
  uintptr_t heap;
};

std::mutex g_mutex;
fake_nvtx_stats_t g_stats{};
std::map<uintptr_t, Heap> g_heaps;      // by base; the handle is the base
std::map<uintptr_t, Region> g_regions;  // by start
std::string g_first_error;
FILE* g_log = nullptr;
int g_domain_token;  // its address is the "cudalloc" domain handle

nvtxDomainHandle_t cudalloc_domain() { return reinterpret_cast<nvtxDomainHandle_t>(&g_domain_token); }

void log_line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_line(const char* fmt, ...) {
  if (g_log == nullptr) {
    const char* path = std::getenv("FAKE_NVTX_LOG");
    if (path == nullptr || (g_log = std::fopen(path, "a")) == nullptr) return;
  }
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(g_log, fmt, ap);
  va_end(ap);
  std::fputc('\n', g_log);
  std::fflush(g_log);
}

void error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void error(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  ++g_stats.errors;
  if (g_first_error.empty()) g_first_error = buf;
  log_line("ERROR %s", buf);
}

// How many frees of device memory the fake driver has done (cudalloc sends only its segments
// to the driver in caching mode).
uint64_t driver_frees() {
  using CountFn = uint64_t (*)(const char*);
  static CountFn count = [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return h == nullptr ? nullptr : reinterpret_cast<CountFn>(dlsym(h, "fakecuda_call_count"));
  }();
  return count == nullptr ? 0 : count("cuMemFree");
}

const Heap* heap_of(nvtxMemHeapHandle_t h, uintptr_t* base) {
  *base = reinterpret_cast<uintptr_t>(h);
  auto it = g_heaps.find(*base);
  return it == g_heaps.end() ? nullptr : &it->second;
}

bool check_domain(nvtxDomainHandle_t d, const char* call) {
  if (d == cudalloc_domain()) return true;
  error("%s: domain %p is not the one made for \"cudalloc\"", call, static_cast<void*>(d));
  return false;
}

nvtxDomainHandle_t NVTX_API domain_create_a(const char* name) {
  std::lock_guard lock(g_mutex);
  log_line("domain_create %s", name ? name : "(null)");
  if (name != nullptr && std::strcmp(name, "cudalloc") == 0) {
    ++g_stats.domains_cudalloc;
    return cudalloc_domain();
  }
  ++g_stats.domains_other;
  static int other;
  return reinterpret_cast<nvtxDomainHandle_t>(&other);
}

nvtxMemHeapHandle_t NVTX_API heap_register(nvtxDomainHandle_t domain, nvtxMemHeapDesc_t const* desc) {
  std::lock_guard lock(g_mutex);
  check_domain(domain, "nvtxMemHeapRegister");
  if (desc == nullptr || desc->extCompatID != NVTX_EXT_COMPATID_MEM || desc->structSize < sizeof(*desc) ||
      desc->usage != NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR || desc->type != NVTX_MEM_TYPE_VIRTUAL_ADDRESS ||
      desc->typeSpecificDescSize != sizeof(nvtxMemVirtualRangeDesc_t) || desc->typeSpecificDesc == nullptr) {
    error("nvtxMemHeapRegister: bad descriptor");
    return nullptr;
  }
  const auto* range = static_cast<const nvtxMemVirtualRangeDesc_t*>(desc->typeSpecificDesc);
  const uintptr_t base = reinterpret_cast<uintptr_t>(range->ptr);
  log_line("heap_register 0x%lx %zu", static_cast<unsigned long>(base), range->size);
  if (base == 0 || range->size == 0) {
    error("nvtxMemHeapRegister: empty range");
    return nullptr;
  }
  auto next = g_heaps.lower_bound(base);
  const bool overlaps_next = next != g_heaps.end() && next->first < base + range->size;
  const bool overlaps_prev =
      next != g_heaps.begin() && std::prev(next)->first + std::prev(next)->second.size > base;
  if (overlaps_next || overlaps_prev) {
    error("nvtxMemHeapRegister: 0x%lx+%zu overlaps a live heap", static_cast<unsigned long>(base), range->size);
    return nullptr;
  }
  g_heaps[base] = Heap{range->size};
  ++g_stats.heaps_registered;
  ++g_stats.heaps_live;
  return reinterpret_cast<nvtxMemHeapHandle_t>(base);
}

void NVTX_API heap_unregister(nvtxDomainHandle_t domain, nvtxMemHeapHandle_t heap) {
  std::lock_guard lock(g_mutex);
  check_domain(domain, "nvtxMemHeapUnregister");
  uintptr_t base = 0;
  const Heap* h = heap_of(heap, &base);
  const uint64_t frees = driver_frees();
  log_line("heap_unregister 0x%lx driver_frees=%lu", static_cast<unsigned long>(base),
           static_cast<unsigned long>(frees));
  if (h == nullptr) {
    error("nvtxMemHeapUnregister: 0x%lx is no live heap", static_cast<unsigned long>(base));
    return;
  }
  if (frees > g_stats.heaps_unregistered) ++g_stats.late_heap_unregisters;
  // Unregistering a heap drops its regions (nvToolsExtMem.h).
  const uintptr_t end = base + h->size;
  for (auto it = g_regions.lower_bound(base); it != g_regions.end() && it->first < end;) {
    it = g_regions.erase(it);
    --g_stats.regions_live;
  }
  g_heaps.erase(base);
  ++g_stats.heaps_unregistered;
  --g_stats.heaps_live;
}

void NVTX_API regions_register(nvtxDomainHandle_t domain, nvtxMemRegionsRegisterBatch_t const* b) {
  std::lock_guard lock(g_mutex);
  check_domain(domain, "nvtxMemRegionsRegister");
  if (b == nullptr || b->extCompatID != NVTX_EXT_COMPATID_MEM || b->structSize < sizeof(*b) ||
      b->regionType != NVTX_MEM_TYPE_VIRTUAL_ADDRESS ||
      b->regionDescElementSize != sizeof(nvtxMemVirtualRangeDesc_t) || b->regionDescElements == nullptr) {
    error("nvtxMemRegionsRegister: bad batch");
    return;
  }
  uintptr_t base = 0;
  const Heap* h = heap_of(b->heap, &base);
  const auto* ranges = static_cast<const nvtxMemVirtualRangeDesc_t*>(b->regionDescElements);
  for (size_t i = 0; i < b->regionCount; ++i) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ranges[i].ptr);
    const size_t n = ranges[i].size;
    log_line("region_register 0x%lx %zu heap 0x%lx", static_cast<unsigned long>(p), n,
             static_cast<unsigned long>(base));
    if (h == nullptr) {
      error("nvtxMemRegionsRegister: heap 0x%lx is not live", static_cast<unsigned long>(base));
      continue;
    }
    if (n == 0 || p < base || p + n > base + h->size) {
      error("nvtxMemRegionsRegister: 0x%lx+%zu is not inside its heap", static_cast<unsigned long>(p), n);
      continue;
    }
    auto next = g_regions.lower_bound(p);
    if ((next != g_regions.end() && next->first < p + n) ||
        (next != g_regions.begin() && std::prev(next)->first + std::prev(next)->second.size > p)) {
      error("nvtxMemRegionsRegister: 0x%lx+%zu overlaps a live region", static_cast<unsigned long>(p), n);
      continue;
    }
    g_regions[p] = Region{n, base};
    ++g_stats.regions_registered;
    ++g_stats.regions_live;
  }
}

void NVTX_API regions_unregister(nvtxDomainHandle_t domain, nvtxMemRegionsUnregisterBatch_t const* b) {
  std::lock_guard lock(g_mutex);
  check_domain(domain, "nvtxMemRegionsUnregister");
  if (b == nullptr || b->extCompatID != NVTX_EXT_COMPATID_MEM || b->structSize < sizeof(*b) ||
      b->refType != NVTX_MEM_REGION_REF_TYPE_POINTER || b->refElementSize != sizeof(nvtxMemRegionRef_t) ||
      b->refElements == nullptr) {
    error("nvtxMemRegionsUnregister: bad batch");
    return;
  }
  for (size_t i = 0; i < b->refCount; ++i) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(b->refElements[i].pointer);
    log_line("region_unregister 0x%lx", static_cast<unsigned long>(p));
    if (g_regions.erase(p) == 0) {
      error("nvtxMemRegionsUnregister: 0x%lx is no live region", static_cast<unsigned long>(p));
      continue;
    }
    ++g_stats.regions_unregistered;
    --g_stats.regions_live;
  }
}

template <typename F>
void set_slot(nvtxExtModuleSegment_t& s, size_t id, F* fn) {
  if (id < s.slotCount) s.functionSlots[id] = reinterpret_cast<intptr_t>(fn);
}

}  // namespace

EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->struct_size < sizeof(NvtxExportTableCallbacks)) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr ||
      size <= NVTX_CBID_CORE2_DomainCreateA) {
    return 0;
  }
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create_a);
  std::lock_guard lock(g_mutex);
  ++g_stats.core_inits;
  log_line("core_init");
  return 1;
}

EXPORT int InitializeInjectionNvtxExtension(nvtxExtModuleInfo_t* info) {
  if (info == nullptr) return 0;
  std::lock_guard lock(g_mutex);
  log_line("ext_init module %u compat 0x%x segments %zu", info->moduleId, info->compatId, info->segmentsCount);
  if (info->moduleId != NVTX_EXT_MODULEID_MEM) return 1;  // other modules: nothing attached
  if (info->compatId != NVTX_EXT_COMPATID_MEM || info->segmentsCount < 1 || info->segments == nullptr) {
    error("memory module: unexpected compatId 0x%x or no segment", info->compatId);
    return 0;
  }
  nvtxExtModuleSegment_t& s = info->segments[0];
  set_slot(s, NVTX3EXT_CBID_nvtxMemHeapRegister, &heap_register);
  set_slot(s, NVTX3EXT_CBID_nvtxMemHeapUnregister, &heap_unregister);
  set_slot(s, NVTX3EXT_CBID_nvtxMemRegionsRegister, &regions_register);
  set_slot(s, NVTX3EXT_CBID_nvtxMemRegionsUnregister, &regions_unregister);
  ++g_stats.mem_inits;
  return 1;
}

EXPORT int fake_nvtx_region(uintptr_t ptr, size_t* size, uintptr_t* heap_base, size_t* heap_size) {
  std::lock_guard lock(g_mutex);
  auto it = g_regions.find(ptr);
  if (it == g_regions.end()) return 0;
  *size = it->second.size;
  *heap_base = it->second.heap;
  *heap_size = g_heaps.at(it->second.heap).size;
  return 1;
}

EXPORT void fake_nvtx_stats(fake_nvtx_stats_t* out) {
  std::lock_guard lock(g_mutex);
  *out = g_stats;
}

EXPORT const char* fake_nvtx_first_error() {
  std::lock_guard lock(g_mutex);
  return g_first_error.c_str();  // stays valid: set once
}
