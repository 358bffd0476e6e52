// The allocation trace writer (docs/trace-format.md, version 1).
//
// The allocator calls on_event() on the allocating thread, sometimes under its device lock. The
// writer stamps the record (time, thread, optional native stack and NVTX range), puts it in the
// thread's own bounded lane (trace/trace_lanes.h) and returns: no I/O, no lock, no allocation,
// and no cache line shared with another allocating thread (a thread's first record takes its
// lane, once, under a mutex). A background thread, started on the first record, merges the
// lanes by time, formats the lines and writes them with write(2) in large chunks. When a lane is
// full the record is dropped and counted; the count is written as a `dropped` record, never lost
// silently.
//
// Files: the first process to lock `path` writes it; any other process (a fork child, a second
// process given the same path while the first still runs) writes `path.PID`. See open().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <sys/types.h>

#include "allocator/events.h"
#include "trace/trace_clock.h"

namespace cudalloc {

class TraceLane;

struct TraceOptions {
  std::size_t stack_depth = 0;        // trace_stacks:N native frames per record (0: none; max 64)
  bool nvtx = false;                  // trace_nvtx: record the current NVTX range name
  // Consult the id hook (set_nvtx_id_hooks) even without `nvtx`: the shim's reports the C API's
  // phases (cudalloc_phase_push), which are recorded whether or not NVTX ranges are.
  bool phases = false;
  // Records held in memory per allocating thread (each has its own lane); rounded up to a power
  // of two. 16384 records are about 1.3 MB a thread, without stacks.
  std::size_t ring_capacity = 16384;
  // trace_clock: what stamps records (trace/trace_clock.h). The file's ts_ns is the same either way.
  TraceClockSource clock = TraceClockSource::kTsc;
  // How the stream column spells an allocator event's stream key, called on the writer thread
  // (null: the key itself). The shim's keys are addresses of its stream records, and it writes
  // the program's handle; passthrough records carry the program's handle already.
  using StreamLabel = std::uint64_t (*)(StreamHandle key) noexcept;
  StreamLabel stream_label = nullptr;
};

// Fills `out` (capacity bytes, not NUL-terminated) with the calling thread's current NVTX range
// (recommended: the range stack, outermost first, joined with '/'), returns the length, 0 when
// there is none. Called on the allocating thread under the device lock: must not block.
using NvtxRangeHook = std::size_t (*)(char* out, std::size_t capacity) noexcept;

// The id form the shim uses, which keeps text off the allocating thread: `current` returns the
// calling thread's range as an id (0: none) and may only read thread-local state; `text` gives
// an id's text (at most kMaxNvtx bytes, not NUL-terminated; 0 when unknown) on the writer
// thread or in the fatal-signal flush, so it must not block or allocate. Ids must stay valid.
using NvtxIdHook = std::uint32_t (*)() noexcept;
using NvtxTextHook = std::size_t (*)(std::uint32_t id, const char** text) noexcept;

// The `result` column's spelling of a status (docs/trace-format.md).
const char* trace_result_name(Status s) noexcept;

class TraceWriter final : public AllocatorObserver {
 public:
  static constexpr std::size_t kMaxStackDepth = 64;
  static constexpr std::size_t kMaxNvtx = 64;

  // Opens the trace for this process. The rule (trace/owned_file.h: new files 0600, created
  // exclusively; an existing one only if it is a regular file of this user's with one name):
  //  - open (or create) `path` and take an exclusive flock on it without waiting; if that
  //    works, truncate it and write there (sequential runs overwrite their trace);
  //  - if another live process holds the lock, write `path.PID` instead.
  // Returns null, with the reason in `*error`, in secure-execution mode (AT_SECURE), when `path`
  // is a symlink, not a regular file, another user's, or hard-linked, or cannot be opened.
  static std::unique_ptr<TraceWriter> open(const std::string& path, const TraceOptions& options,
                                           std::string* error = nullptr);

  // Flushes what is queued, writes the end comment and closes the file.
  ~TraceWriter() override;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // AllocatorObserver: every EventKind, passthrough ones included. Never blocks.
  void on_event(const AllocatorEvent& event) noexcept override;

  // Drains the ring and writes everything to the file (atexit; blocks a few ms at most).
  void flush() noexcept;
  // Flushes and writes the closing `# end` line, once: for an exit handler, since a writer
  // living in a preloaded library is never destroyed. Later records still go to the file.
  void finish() noexcept;

  // Installs handlers for SIGSEGV, SIGABRT, SIGBUS, SIGTERM and SIGINT that write what they can
  // of this writer's queued records (async-signal-safe: no malloc, no lock that can block
  // forever), then hand the signal to the handler installed before (or the default action).
  // One writer at a time is flushed on signals: the last one that called this.
  void install_fatal_signal_flush();

  // In a fork child (call from pthread_atfork's child handler): forgets the parent's queued
  // records and writer thread, and re-opens this writer on its own `path.PID` file (a fresh
  // header; the same options). The object stays valid as the allocator's observer. If the
  // file cannot be opened, the writer is disabled (records are ignored).
  void after_fork_child() noexcept;

  // Set by the shim when NVTX tracing is on; null (the default) records no range.
  static void set_nvtx_hook(NvtxRangeHook hook) noexcept;
  // The id hooks; while `current` is set they are used instead of the text hook.
  static void set_nvtx_id_hooks(NvtxIdHook current, NvtxTextHook text) noexcept;

  // The file actually written (`path` or `path.PID`).
  const std::string& file_path() const { return file_path_; }
  // Records lost to a full lane so far (all reported, or to be reported, in `dropped` records).
  std::uint64_t dropped_total() const noexcept;
  std::uint64_t written_total() const { return written_total_.load(std::memory_order_relaxed); }
  // Records the file system refused (a full disk): counted in a `dropped` record with
  // reason=disk_full once it takes lines again, in the end line's lost=, and logged at exit.
  std::uint64_t lost_total() const noexcept;

  // Where the writer's messages go (a refused write, once; the lost count at exit): the shim's
  // log. Null: stderr. Called on the writer thread or at exit, never in a signal handler.
  using MessageHook = void (*)(const char* message) noexcept;
  static void set_message_hook(MessageHook hook) noexcept;
  // For tests: the write(2) the writer calls (null: write(2) itself), to play a full disk.
  using WriteFn = ssize_t (*)(int fd, const void* data, std::size_t n);
  static void set_write_for_testing(WriteFn fn) noexcept;

  // For tests: lanes created so far (one per thread recording at once, reused after exit).
  std::size_t lanes_for_testing() const noexcept;
  // For tests: while paused, the background thread does not drain (flush() still does).
  void pause_writer_for_testing(bool paused) { paused_.store(paused); }

  struct Impl;

 private:
  TraceWriter(std::string base_path, const TraceOptions& options);
  bool open_file(bool allow_base, std::string* error);
  void start_thread() noexcept;
  void stop_thread() noexcept;
  std::size_t drain_locked(bool final_pass) noexcept;
  bool work_pending() const noexcept;
  void wake_writer() noexcept;
  TraceLane* attach_lane() noexcept;
  void write_header() noexcept;
  void write_maps() noexcept;
  void write_out(const char* data, std::size_t n) noexcept;
  bool write_lines(const char* data, std::size_t n) noexcept;
  void write_lost_record() noexcept;
  void report_write_errors(bool at_exit) noexcept;
  static void emit_message(const char* msg) noexcept;
  void flush_buffer() noexcept;
  bool lock_consumer(bool from_signal) noexcept;
  void unlock_consumer() noexcept;
  void thread_main() noexcept;
  static void* thread_entry(void* self) noexcept;
  friend void trace_signal_handler(int, void*, void*);

  std::string base_path_;
  std::string file_path_;
  TraceOptions options_;
  int fd_ = -1;
  int pid_ = 0;
  std::unique_ptr<Impl> impl_;

  // Read on every record (with options_, pid_ and impl_ above): the writer thread rarely
  // writes here.
  std::atomic<bool> disabled_{false};
  std::atomic<int> thread_state_{0};  // 0 none, 1 starting/running, 2 stopping
  std::atomic<bool> stop_{false};
  std::atomic<bool> paused_{false};
  // Written by the writer thread on every pass or sleep: away from the line above.
  alignas(64) std::atomic<bool> consumer_busy_{false};
  std::atomic<std::uint32_t> writer_sleeping_{0};
  std::atomic<bool> finished_{false};
  std::atomic<std::uint64_t> written_total_{0};
};

}  // namespace cudalloc
