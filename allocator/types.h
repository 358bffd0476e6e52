// Plain value types shared by the allocator core and its backends.
#pragma once

#include <cstddef>
#include <cstdint>

// A function on the path of a cached allocate or free. GCC puts such functions in .text.hot,
// which the linker lays out together: the path then spans a few cache lines and pages of code
// instead of being scattered over the library.
#define CUDALLOC_HOT __attribute__((hot))
// A small step of that path that GCC would otherwise leave out of line (at -O2 it declines
// loops it cannot size and functions it judges large), paying a call and spills for it.
#define CUDALLOC_INLINE __attribute__((always_inline)) inline
// The slow end of a hot path. A hot path whose only calls are its last (tail calls) saves no
// registers and builds no frame; one call it returns from costs it both, hit or miss.
#define CUDALLOC_NOINLINE __attribute__((noinline))

namespace cudalloc {

using DevicePtr = std::uintptr_t;

// An opaque stream handle, as the backend understands it (a CUstream for the driver backend).
// 0 is the legacy default stream.
using StreamHandle = std::uintptr_t;

// Blocks handed out by cudaMalloc-style calls belong to no stream: they may be used on any
// stream, so they are only reused once every stream has passed their free (a device fence).
inline constexpr StreamHandle kNoStream = ~StreamHandle{0};

enum class Status {
  kOk,
  kInvalidValue,   // bad size, unknown or interior pointer, double free
  kOutOfMemory,
  kBackendError,   // the device reported something else
  kDeinitialized,  // the driver is shutting down (process exit)
  kDeferred,       // SegmentBackend::free_segment only: the device takes the memory back later
};

const char* to_string(Status s);

inline constexpr std::size_t kKiB = 1024;
inline constexpr std::size_t kMiB = 1024 * kKiB;
inline constexpr std::size_t kGiB = 1024 * kMiB;

}  // namespace cudalloc
