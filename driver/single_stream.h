// single_stream:true — the program promises to run its device work on the legacy default
// stream only, as PyTorch and most single-stream codes do. Then a cudaFree is ordered on that
// stream, like a cudaFreeAsync there: the next allocation reuses the block at once, with no
// device fence, because whatever its next owner queues runs after whatever its last owner
// queued. No fence means no cudaFree'd memory waiting for a GPU that lags the host, so the
// cache holds what PyTorch's own allocator would.
//
// cudalloc ends the mode for good as soon as it sees another stream at work: a non-blocking
// stream created, any stream but the legacy one in a memory call (a per-thread default stream
// too), a capture, a second context. A blocking stream's creation does not end it: the legacy
// stream waits for earlier work on blocking streams and they wait for earlier legacy work, so
// a helper stream that a library forks work onto and joins back (cuBLASLt makes one) is
// ordered with the legacy frees. Nor does a non-blocking helper stream of a library that forks
// and joins its own streams (cuDNN; helper_streams.h). Each
// live context then records an event on its legacy stream behind the work of the ordered era,
// and every non-blocking stream waits for that event before its first work (blocking and
// per-thread default streams wait for earlier legacy work by themselves). From then on
// cudaFree'd blocks are fenced as usual. What cudalloc cannot see is the promise's part:
// work sent to a per-thread default stream through calls it does not wrap (kernels launched
// from code built with --default-stream per-thread, or on cudaStreamPerThread), and work on
// two blocking streams with no legacy work between them, where a block cudaFree'd after the
// first is reused by the second.
#pragma once

#include <atomic>
#include <mutex>

namespace cudalloc::shim {

class DriverBackend;
struct StreamInfo;

// The contexts whose ordered era ends with the mode (ContextRegistry). An interface, so that
// the mode knows nothing of the registry, which holds it.
class OrderedEras {
 public:
  // Each live context records the end of its ordered era (DriverBackend::end_ordered_era).
  virtual void end_ordered_eras() = 0;

 protected:
  ~OrderedEras() = default;
};

class SingleStreamMode {
 public:
  explicit SingleStreamMode(bool configured) : active_(configured), configured_(configured) {}

  // True while cudaFree'd blocks are ordered on the legacy stream.
  bool active() const { return active_.load(); }
  // Ends the mode (the first call only); `why` names what was seen, for the log.
  void leave(OrderedEras& contexts, const char* why);
  // `s` is a stream of the context of `owner`, just created or first met: ends the mode, and
  // a non-blocking `s` waits for the ordered era's legacy work before its own.
  void stream_seen(OrderedEras& contexts, DriverBackend& owner, StreamInfo* s, const char* why);

 private:
  static void log_caller();

  std::atomic<bool> active_;
  const bool configured_;
  std::mutex mutex_;  // held while the mode ends, so no stream waits for an event not recorded yet
};

}  // namespace cudalloc::shim
