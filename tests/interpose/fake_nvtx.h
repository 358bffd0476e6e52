// Query API of the fake NVTX injection (fake_nvtx_injection.cpp), a stand-in for the part of
// compute-sanitizer that receives NVTX memory calls. Reach it with dlsym on
// dlopen(getenv("NVTX_INJECTION64_PATH"), RTLD_NOLOAD | RTLD_LAZY).
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {

struct fake_nvtx_stats_t {
  uint64_t core_inits;            // InitializeInjectionNvtx2 calls
  uint64_t mem_inits;             // InitializeInjectionNvtxExtension calls for the memory module
  uint64_t domains_cudalloc;      // nvtxDomainCreateA("cudalloc")
  uint64_t domains_other;
  uint64_t heaps_registered;
  uint64_t heaps_unregistered;
  uint64_t heaps_live;
  uint64_t regions_registered;
  uint64_t regions_unregistered;
  uint64_t regions_live;
  uint64_t errors;                // calls that broke a rule; the first is in fake_nvtx_first_error
  // Heap unregistrations that came after the driver had freed more segments than heaps had
  // been unregistered before them: the segment went back to the driver first.
  uint64_t late_heap_unregisters;
};

// 1 if a region starts at `ptr`: its registered size and its heap's range.
typedef int (*fake_nvtx_region_fn)(uintptr_t ptr, size_t* size, uintptr_t* heap_base, size_t* heap_size);
typedef void (*fake_nvtx_stats_fn)(fake_nvtx_stats_t* out);
typedef const char* (*fake_nvtx_first_error_fn)(void);

}  // extern "C"
