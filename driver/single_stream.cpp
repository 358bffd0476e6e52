#include "driver/single_stream.h"

#include <execinfo.h>

#include <cstdlib>

#include "driver/driver_backend.h"
#include "driver/streams.h"
#include "support/log.h"

namespace cudalloc::shim {

void SingleStreamMode::leave(OrderedEras& contexts, const char* why) {
  if (!active()) return;
  std::lock_guard lock(mutex_);
  if (!active_.load()) return;
  // Off first, then the events: a free that still saw the mode on queued its block's work
  // before this store, so before the events below.
  active_.store(false);
  contexts.end_ordered_eras();
  log_info("single_stream: off from now on (%s); cudaFree'd blocks wait for device fences again", why);
  log_caller();
}

// At debug level, who ended the mode: a library that creates a stream it never uses is worth
// knowing about. Once per process, never on the hot path.
void SingleStreamMode::log_caller() {
  if (!log_enabled(LogLevel::kDebug)) return;
  void* frames[24];
  const int n = ::backtrace(frames, 24);
  char** names = ::backtrace_symbols(frames, n);
  if (names == nullptr) return;
  for (int i = 1; i < n; ++i) log_debug("single_stream:   #%d %s", i, names[i]);
  std::free(names);
}

void SingleStreamMode::stream_seen(OrderedEras& contexts, DriverBackend& owner, StreamInfo* s,
                                   const char* why) {
  if (!configured_) return;
  leave(contexts, why);
  std::lock_guard lock(mutex_);
  owner.follow_ordered_era(s);
}

}  // namespace cudalloc::shim
