// The shim's process-wide state, made at the first intercepted CUDA call (never in a
// constructor: a process that never touches CUDA must not be changed by the preload).
#pragma once

#include "config/config.h"
#include "shim/capture.h"
#include "shim/context_state.h"
#include "shim/single_stream.h"
#include "shim/streams.h"

namespace cudalloc::shim {

struct Runtime {
  Config config;
  bool passthrough = false;
};

// First call: reads the configuration (a bad one prints one line and exits with status 1,
// before any CUDA work), logs it, registers the fork handler.
const Runtime& runtime();

// What caching keeps about the process. A fork child gets a fresh one.
struct ProcessState {
  explicit ProcessState(const Config& config)
      : single_stream(config.single_stream), contexts(config.allocator, captures, single_stream) {}
  CaptureTracker captures;
  StreamRegistry streams;
  SingleStreamMode single_stream;
  ContextRegistry contexts;
};

// The caching state; null in passthrough mode.
ProcessState* caching_state();

}  // namespace cudalloc::shim
