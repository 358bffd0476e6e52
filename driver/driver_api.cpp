#include "driver/driver_api.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "allocator/types.h"
#include "support/real_dlsym.h"

namespace cudalloc::shim {

namespace detail {
std::atomic<const DriverApi*> g_api{nullptr};
}  // namespace detail

namespace {

using detail::g_api;
std::mutex g_resolve_mutex;  // the first lookups race; one thread resolves, others wait
const DriverApi g_empty{};

const DriverApi* resolve(void* handle) {
  std::lock_guard lock(g_resolve_mutex);
  if (const DriverApi* done = g_api.load(std::memory_order_acquire)) return done;
  // Never freed: hooks may run during exit, after static destructors.
  auto* api = new DriverApi;
  const DlsymFn sym = real_dlsym();
#define CUDALLOC_RESOLVE(name, type) api->name = reinterpret_cast<std::add_pointer_t<type>>(sym(handle, #name));
  CUDALLOC_DRIVER_FUNCTIONS(CUDALLOC_RESOLVE)
#undef CUDALLOC_RESOLVE
  g_api.store(api, std::memory_order_release);
  return api;
}

template <typename F>
struct Refuse;
template <typename... Args>
struct Refuse<CUresult(Args...)> {
  static CUresult call(Args...) { return CUDA_ERROR_NOT_INITIALIZED; }
};

}  // namespace

void refuse_driver_calls() {
  // Never freed, like the real table: calls may still be under way on other threads.
  static const DriverApi* const refusing = [] {
    auto* api = new DriverApi;
#define CUDALLOC_REFUSE(name, type) api->name = &Refuse<type>::call;
    CUDALLOC_DRIVER_FUNCTIONS(CUDALLOC_REFUSE)
#undef CUDALLOC_REFUSE
    return api;
  }();
  g_api.store(refusing, std::memory_order_release);
}

CUDALLOC_HOT const DriverApi* driver_if_loaded() {
  if (const DriverApi* api = g_api.load(std::memory_order_acquire)) return api;
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  return resolve(handle);  // the NOLOAD reference is kept: libcuda is never unloaded
}

const DriverApi& detail::driver_slow() {
  if (const DriverApi* api = driver_if_loaded()) return *api;
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) return g_empty;
  return *resolve(handle);
}

}  // namespace cudalloc::shim
