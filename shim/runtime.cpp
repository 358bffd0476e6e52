#include "shim/runtime.h"

#include <pthread.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>

#include "driver/driver_api.h"
#include "shim/observers.h"
#include "shim/passthrough.h"
#include "shim/sanitizer_nvtx.h"
#include "shim/stats.h"
#include "shim/tracing.h"
#include "shim/submissions.h"
#include "support/log.h"

extern char** environ;

namespace cudalloc::shim {

namespace detail {
std::atomic<const Runtime*> g_runtime{nullptr};
std::atomic<ProcessState*> g_state{nullptr};
std::atomic<bool> g_state_due{false};
}  // namespace detail

// Each context's allocator reports to the observers (the trace and NVTX registration, started
// before the state is made), its pinned host cache to the trace only.
ProcessState::ProcessState(const Config& config)
    : single_stream(config.single_stream),
      contexts(config.allocator, captures, single_stream, ContextObservers{&allocator_observer, &trace_observer},
               config.watch_submissions ? &submissions() : nullptr) {
  // The program's cached virtual memory pairs and cudalloc's own caches give way to each other
  // when a device runs out of memory.
  contexts.set_device_reclaimer([this](CUdevice dev) { return vmm.release_cached(static_cast<int>(dev)); });
  vmm.set_reclaimer([this](int dev) {
    std::size_t released = 0;
    for (ContextState* s : contexts.live()) {
      if (s->device == dev) released += s->allocator.release_cached();
    }
    return released;
  });
}

namespace {

using detail::g_runtime;
using detail::g_state;
using detail::g_state_due;
std::mutex g_init_mutex;

// The child of a fork cannot use the parent's CUDA contexts, and locks held by the parent's
// other threads would stay locked forever: it starts over with empty state (the old is leaked),
// made at its first call (caching_state_after_fork), not here: a fork handler must not call
// the heap, whose lock another parent thread may have held at the fork (ASan's allocator, for
// one, then never lets the child through).
void after_fork_in_child() {
  new (&g_init_mutex) std::mutex;
  DeviceAllocator::abandon_thread_caches_after_fork();
  log_reset_after_fork();
  tracing_after_fork_child();
  nvtx_after_fork_child();
  const Runtime* rt = g_runtime.load(std::memory_order_relaxed);
  if (rt != nullptr && !rt->passthrough) {
    g_state.store(nullptr, std::memory_order_relaxed);
    g_state_due.store(true, std::memory_order_release);
  }
}

// Idle cached pinned memory goes back to the driver at exit. Registered first, so that it runs
// after the statistics (which then show what was cached) and the trace's end. The state as it
// is: a fork child that never called CUDA makes none for this.
void release_host_at_exit() {
  if (ProcessState* ps = g_state.load(std::memory_order_acquire)) ps->contexts.release_host_caches();
}

// CUDALLOC_STATS=1: a table per context at exit (contexts destroyed before printed theirs
// then: hooks_context.cpp).
void print_stats_at_exit() {
  ProcessState* ps = caching_state();
  print_stats(ps != nullptr ? &ps->contexts : nullptr);
  if (ps != nullptr) print_vmm_stats(ps->vmm);
}

// A refused configuration: the process exits with status 1 before any CUDA work. exit() runs
// the program's atexit handlers and static destructors, and one that makes a CUDA call comes
// back here, on this thread or another: it finds a runtime published before the lock was let
// go (so it never waits for this thread, which holds nothing while it exits) whose driver
// calls all answer CUDA_ERROR_NOT_INITIALIZED.
const Runtime* init() {
  std::unique_lock lock(g_init_mutex);
  if (const Runtime* rt = g_runtime.load(std::memory_order_acquire)) return rt;
  ConfigResult loaded = load_config(process_env());
  if (!loaded.config) {
    auto* refused = new Runtime;  // never freed: hooks run during exit, after static destructors
    refused->passthrough = true;  // no cache state: every hook goes to the refusing driver table
    refuse_driver_calls();
    g_runtime.store(refused, std::memory_order_release);
    lock.unlock();
    std::fprintf(stderr, "cudalloc: %s\n", loaded.error.c_str());
    std::fflush(stderr);
    std::exit(1);
  }
  auto* rt = new Runtime;
  rt->config = std::move(*loaded.config);
  log_configure(rt->config.log_level, rt->config.log_file);
  const char* reason = "";
  // Like every variable cudalloc reads, the sanitizer's count for nothing in secure execution.
  const CacheMode mode = choose_mode(rt->config, sanitizer_env(::getauxval(AT_SECURE) != 0 ? nullptr : environ), &reason);
  rt->passthrough = mode == CacheMode::kPassthrough;
  // One NVTX heap per segment; an expandable segment's chunks come and go inside one
  // reservation, which the heap model does not describe without more bookkeeping.
  if (mode == CacheMode::kNvtx && (rt->config.allocator.expandable_segments || rt->config.allocator.page_stitching)) {
    rt->config.allocator.expandable_segments = false;
    rt->config.allocator.page_stitching = false;
    log_warn("CUDALLOC_SANITIZER=nvtx: expandable segments are turned off (plain segments are registered "
             "with NVTX)");
  }
  log_info("configuration: %s", describe(rt->config).c_str());
  if (rt->passthrough) log_info("passthrough mode (%s): every call goes to the driver", reason);
  if (mode == CacheMode::kNvtx) {
    log_info("nvtx mode (%s): caching, segments and live blocks registered with the NVTX memory API", reason);
    start_nvtx_registration();
  }
  std::atexit(release_host_at_exit);
  start_tracing(rt->config);
  if (rt->config.stats_at_exit) std::atexit(print_stats_at_exit);
  if (!rt->passthrough) g_state.store(new ProcessState(rt->config), std::memory_order_release);
  pthread_atfork(nullptr, nullptr, after_fork_in_child);
  g_runtime.store(rt, std::memory_order_release);
  return rt;
}

}  // namespace

const Runtime& runtime() {
  const Runtime* rt = g_runtime.load(std::memory_order_acquire);
  return rt != nullptr ? *rt : *init();
}

ProcessState* detail::caching_state_first() {
  init();
  return g_state.load(std::memory_order_acquire);
}

ProcessState* detail::caching_state_after_fork() {
  std::lock_guard lock(g_init_mutex);
  if (g_state_due.load(std::memory_order_acquire)) {
    g_state.store(new ProcessState(g_runtime.load(std::memory_order_relaxed)->config), std::memory_order_release);
    g_state_due.store(false, std::memory_order_release);
  }
  return g_state.load(std::memory_order_acquire);
}

}  // namespace cudalloc::shim
