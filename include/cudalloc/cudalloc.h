/* cudalloc's in-process API: statistics, memory summary, cache and limit control, trace flush
 * and phase markers, for programs running with libcudalloc.so preloaded (or linked).
 *
 * Every function returns a cudalloc_status (0: CUDALLOC_OK) and writes its answers through
 * pointers, so an error can never be read as a figure. Calls are thread-safe and take the
 * allocator's locks: call them between steps, not once per allocation.
 *
 * Two ways to use it:
 *  - link with -lcudalloc (pkg-config cudalloc) and call the functions;
 *  - or, for a program that must also run without cudalloc, define CUDALLOC_DYNAMIC before
 *    including this header: the functions become static inline wrappers that look the library
 *    up in the process (dlsym with RTLD_DEFAULT; -ldl before glibc 2.34) and return
 *    CUDALLOC_ERROR_NOT_LOADED when it is not there.
 *
 * Versioning: CUDALLOC_API_VERSION grows by one whenever functions, statuses or statistics are
 * added; what exists never changes its signature or meaning. A program built against version N
 * works with any library whose cudalloc_api_version() is N or more. */
#ifndef CUDALLOC_CUDALLOC_H
#define CUDALLOC_CUDALLOC_H

#include <stddef.h>
#include <stdint.h>

#define CUDALLOC_API_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudalloc_status {
  CUDALLOC_OK = 0,
  /* The library is not in this process (only CUDALLOC_DYNAMIC wrappers return it). */
  CUDALLOC_ERROR_NOT_LOADED = 1,
  /* Caching is off (CUDALLOC_NO_CACHING, or passthrough under compute-sanitizer): every call
   * goes to the driver and cudalloc keeps no figures. */
  CUDALLOC_ERROR_PASSTHROUGH = 2,
  CUDALLOC_ERROR_INVALID_DEVICE = 3,
  CUDALLOC_ERROR_INVALID_VALUE = 4, /* a null pointer, a fraction outside (0, 1], ... */
  CUDALLOC_ERROR_UNKNOWN_KEY = 5,   /* cudalloc_stat: no statistic of that name */
  CUDALLOC_ERROR_NOT_TRACING = 6,   /* no CUDALLOC_TRACE in this process */
  /* The answer needs the device's size, and CUDA has not been initialised in this process. */
  CUDALLOC_ERROR_NOT_INITIALIZED = 7,
  CUDALLOC_ERROR_NO_PHASE = 8 /* cudalloc_phase_pop with no phase open */
} cudalloc_status;

/* Device arguments: an ordinal, or one of these. */
#define CUDALLOC_CURRENT_DEVICE (-1) /* the calling thread's current context's device (0 if none) */
#define CUDALLOC_ALL_DEVICES (-2)    /* cudalloc_empty_cache and cudalloc_reset_peak_memory_stats only */

/* The API version the library implements (CUDALLOC_API_VERSION of its build). */
int cudalloc_api_version(void);
/* The library's release, "MAJOR.MINOR.PATCH". */
const char* cudalloc_version(void);
/* A short English description of a status. */
const char* cudalloc_status_string(int status);

/* Statistics, named as torch.cuda.memory_stats() names them: "allocated_bytes.all.current",
 * "reserved_bytes.large_pool.peak", "active_bytes.all.current", "num_alloc_retries",
 * "num_ooms", "num_device_alloc", "num_device_free", ... A device's figures are those of all
 * the process's contexts on it (their sum; a peak is the sum of the contexts' peaks). A device
 * where the process has made no allocation has all figures 0. */
int cudalloc_stat(int device, const char* key, int64_t* value);
/* The number of statistics, and the name of each (NULL past the end). Names are static. */
size_t cudalloc_stat_count(void);
const char* cudalloc_stat_name(size_t index);
/* All statistics of `device` at one moment: values[i] is cudalloc_stat_name(i)'s value, for i
 * below min(capacity, cudalloc_stat_count()). */
int cudalloc_stats(int device, int64_t* values, size_t capacity);

/* The torch.cuda.memory_summary()-style table of `device`, NUL-terminated in `buf` (cut to
 * size - 1 characters; buf may be NULL when size is 0). *length receives the table's full
 * length without the NUL: if it is size or more, call again with a buffer of *length + 1. */
int cudalloc_memory_summary(int device, char* buf, size_t size, size_t* length);

/* Peaks become the current values (torch.cuda.reset_peak_memory_stats). */
int cudalloc_reset_peak_memory_stats(int device);

/* Waits for pending frees, then gives every idle cached segment of the device back to the
 * driver, as cudaMemPoolTrimTo(pool, 0) does (torch.cuda.empty_cache). `released` (may be
 * NULL) receives the bytes given back. */
int cudalloc_empty_cache(int device, size_t* released);

/* The most the process may reserve on a device, all its contexts together. Same meaning as
 * CUDALLOC_CONF's per_process_memory_fraction and memory_limit_mb, which they replace for
 * that device: the limit is fraction x the device's memory, capped at `bytes` when that is
 * not 0. Memory already reserved above a lowered limit stays; new requests beyond it fail
 * with CUDA_ERROR_OUT_OF_MEMORY once the idle cache has been given back. */
int cudalloc_set_memory_fraction(int device, double fraction); /* 0 < fraction <= 1 */
int cudalloc_get_memory_fraction(int device, double* fraction);
int cudalloc_set_memory_limit(int device, size_t bytes); /* 0: no cap in bytes */
/* The limit in force, in bytes (needs CUDA initialised or an allocation made on the device). */
int cudalloc_get_memory_limit(int device, size_t* bytes);

/* Writes every trace record queued so far to the trace file (CUDALLOC_TRACE), so that it can
 * be read while the program runs. */
int cudalloc_trace_flush(void);
/* The trace file's path (as cudalloc_memory_summary fills a buffer). */
int cudalloc_trace_path(char* buf, size_t size, size_t* length);

/* Phase markers: a process-wide stack of names ("forward", then "forward/attn"). Trace records
 * of allocations made while a phase is open carry it in their nvtx= field (docs/trace-format.md)
 * when the allocating thread has no NVTX range of its own. Names are cut at 64 bytes. */
int cudalloc_phase_push(const char* name);
int cudalloc_phase_pop(void);

#ifdef __cplusplus
}
#endif

#ifdef CUDALLOC_DYNAMIC
/* The wrappers: each looks its function up until it is found, then keeps it. */
#include <dlfcn.h>
#ifdef RTLD_DEFAULT
#define CUDALLOC_RTLD_DEFAULT_ RTLD_DEFAULT
#else
#define CUDALLOC_RTLD_DEFAULT_ ((void*)0) /* glibc's value, which it names only under _GNU_SOURCE */
#endif

#define CUDALLOC_DYN_FN_(ret, name, params, args, absent)                      \
  static inline ret name##_dyn_ params {                                       \
    typedef ret(*fn_t) params;                                                 \
    static fn_t fn;                                                            \
    if (fn == NULL) fn = (fn_t)dlsym(CUDALLOC_RTLD_DEFAULT_, #name);                     \
    return fn != NULL ? fn args : (absent);                                    \
  }
CUDALLOC_DYN_FN_(int, cudalloc_api_version, (void), (), 0)
CUDALLOC_DYN_FN_(const char*, cudalloc_version, (void), (), NULL)
CUDALLOC_DYN_FN_(size_t, cudalloc_stat_count, (void), (), 0)
CUDALLOC_DYN_FN_(const char*, cudalloc_stat_name, (size_t i), (i), NULL)
CUDALLOC_DYN_FN_(int, cudalloc_stat, (int d, const char* k, int64_t* v), (d, k, v), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_stats, (int d, int64_t* v, size_t n), (d, v, n), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_memory_summary, (int d, char* b, size_t n, size_t* l), (d, b, n, l),
                 CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_reset_peak_memory_stats, (int d), (d), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_empty_cache, (int d, size_t* r), (d, r), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_set_memory_fraction, (int d, double f), (d, f), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_get_memory_fraction, (int d, double* f), (d, f), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_set_memory_limit, (int d, size_t b), (d, b), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_get_memory_limit, (int d, size_t* b), (d, b), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_trace_flush, (void), (), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_trace_path, (char* b, size_t n, size_t* l), (b, n, l), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_phase_push, (const char* n), (n), CUDALLOC_ERROR_NOT_LOADED)
CUDALLOC_DYN_FN_(int, cudalloc_phase_pop, (void), (), CUDALLOC_ERROR_NOT_LOADED)
#undef CUDALLOC_DYN_FN_

/* Known without the library, so that CUDALLOC_ERROR_NOT_LOADED can be described. */
static inline const char* cudalloc_status_string_dyn_(int status) {
  typedef const char* (*fn_t)(int);
  static fn_t fn;
  if (fn == NULL) fn = (fn_t)dlsym(CUDALLOC_RTLD_DEFAULT_, "cudalloc_status_string");
  if (fn != NULL) return fn(status);
  return status == CUDALLOC_ERROR_NOT_LOADED ? "cudalloc is not loaded in this process" : "unknown status";
}

#define cudalloc_api_version cudalloc_api_version_dyn_
#define cudalloc_version cudalloc_version_dyn_
#define cudalloc_status_string cudalloc_status_string_dyn_
#define cudalloc_stat cudalloc_stat_dyn_
#define cudalloc_stat_count cudalloc_stat_count_dyn_
#define cudalloc_stat_name cudalloc_stat_name_dyn_
#define cudalloc_stats cudalloc_stats_dyn_
#define cudalloc_memory_summary cudalloc_memory_summary_dyn_
#define cudalloc_reset_peak_memory_stats cudalloc_reset_peak_memory_stats_dyn_
#define cudalloc_empty_cache cudalloc_empty_cache_dyn_
#define cudalloc_set_memory_fraction cudalloc_set_memory_fraction_dyn_
#define cudalloc_get_memory_fraction cudalloc_get_memory_fraction_dyn_
#define cudalloc_set_memory_limit cudalloc_set_memory_limit_dyn_
#define cudalloc_get_memory_limit cudalloc_get_memory_limit_dyn_
#define cudalloc_trace_flush cudalloc_trace_flush_dyn_
#define cudalloc_trace_path cudalloc_trace_path_dyn_
#define cudalloc_phase_push cudalloc_phase_push_dyn_
#define cudalloc_phase_pop cudalloc_phase_pop_dyn_
#endif /* CUDALLOC_DYNAMIC */

#endif /* CUDALLOC_CUDALLOC_H */
