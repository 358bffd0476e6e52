// What the allocator tells its observer (events.h): the observer itself, the two running
// totals its records carry (allocated and reserved bytes, kept across threads only while an
// observer is attached: they cost a shared atomic per operation), and the record's assembly.
// The ladder and the thread-cache paths decide what happened; this says it.
//
// Inline: a cached allocate and free ask observed() on every call, and reporting from a thread
// cache updates the allocated count on the record's way out.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/block.h"
#include "allocator/events.h"
#include "allocator/types.h"

namespace cudalloc {

// How the program asked: cudaMalloc/cudaFree, or their stream-ordered *Async forms.
enum class CallKind : bool { kSync, kAsync };
inline constexpr CallKind call_kind(bool async) { return static_cast<CallKind>(async); }
// Whether an allocation was served from cached memory, without a device call.
enum class CacheHit : bool { kMiss, kHit };
// Whether every earlier event about the block came from this thread (AllocatorEvent::local).
enum class Locality : bool { kShared, kLocal };

// One event, as the allocator knows it; the reporter adds the device and the running totals.
struct EventNote {
  EventKind kind;
  StreamHandle stream = 0;
  DevicePtr ptr = 0;
  std::size_t requested = 0;
  std::size_t rounded = 0;
  Status result = Status::kOk;
  CallKind call = CallKind::kSync;
  CacheHit hit = CacheHit::kMiss;
  Locality locality = Locality::kShared;
};

// The observer's pointer comes first, to share the line that the hot paths read anyway; the
// totals, written per operation while observed, start a line of their own (see Impl).
class alignas(64) EventReporter {
 public:
  explicit EventReporter(int device) : device_(device) {}
  EventReporter(const EventReporter&) = delete;
  EventReporter& operator=(const EventReporter&) = delete;

  // Not owned; null to stop. Attach before the first allocation: the totals start then.
  void attach(AllocatorObserver* observer) { observer_.store(observer, std::memory_order_release); }
  // The hot paths' test: whether to leave them for the observed path.
  bool observed() const { return observer_.load(std::memory_order_relaxed) != nullptr; }
  AllocatorObserver* observer() const { return observer_.load(std::memory_order_acquire); }

  // The allocated bytes changed by `delta` on the locked path.
  void count_allocated(std::int64_t delta) {
    if (observed()) allocated_now_.fetch_add(delta, std::memory_order_relaxed);
  }
  // The reserved bytes are now `bytes` (the segment table's count).
  void set_reserved(std::size_t bytes) { reserved_now_.store(bytes, std::memory_order_relaxed); }
  // The context went with its memory (forget_all).
  void forget() {
    reserved_now_.store(0);
    allocated_now_.store(0);
  }

  void notify(const EventNote& note) {
    AllocatorObserver* o = observer();
    if (o == nullptr) return;
    report(*o, note, static_cast<std::size_t>(allocated_now_.load(std::memory_order_relaxed)));
  }

  // A segment event: `bytes` at `ptr` taken from or given back to the device.
  void notify_segment(EventKind kind, StreamHandle stream, DevicePtr ptr, std::size_t bytes) {
    notify({.kind = kind, .stream = stream, .ptr = ptr, .requested = bytes, .rounded = bytes});
  }

  // notify() for a block a thread cache hands out or takes back (`delta`: +size or -size):
  // the record carries the allocated bytes the count's own update returned, with no second
  // look at the shared count.
  void notify_cached(AllocatorObserver& o, const EventNote& note, std::int64_t delta) {
    const std::int64_t after = allocated_now_.fetch_add(delta, std::memory_order_relaxed) + delta;
    report(o, note, static_cast<std::size_t>(after));
  }

 private:
  void report(AllocatorObserver& o, const EventNote& note, std::size_t allocated_after) const {
    AllocatorEvent e;
    e.kind = note.kind;
    e.async = note.call == CallKind::kAsync;
    e.cache_hit = note.hit == CacheHit::kHit;
    e.local = note.locality == Locality::kLocal;
    e.result = note.result;
    e.device = device_;
    e.stream = note.stream;
    e.ptr = note.ptr;
    e.requested = note.requested;
    e.rounded = note.rounded;
    e.allocated_after = allocated_after;
    e.reserved_after = reserved_now_.load(std::memory_order_relaxed);
    o.on_event(e);
  }

  std::atomic<AllocatorObserver*> observer_{nullptr};
  const int device_;
  alignas(64) std::atomic<std::int64_t> allocated_now_{0};
  std::atomic<std::size_t> reserved_now_{0};
};
static_assert(alignof(EventReporter) == 64 && sizeof(EventReporter) == 128,
              "the observer's line, then the totals' own line");

}  // namespace cudalloc
