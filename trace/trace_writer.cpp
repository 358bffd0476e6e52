#include "trace/trace_writer.h"

#include "trace/trace_clock.h"
#include "trace/trace_lanes.h"
#include "trace/owned_file.h"

#include <execinfo.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <charconv>
#include <cstring>
#include <ctime>
#include <new>

namespace cudalloc {

const char* trace_result_name(Status s) noexcept {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kInvalidValue: return "invalid_value";
    case Status::kOutOfMemory: return "out_of_memory";
    case Status::kBackendError: return "device_error";
    case Status::kDeinitialized: return "deinitialized";
    case Status::kDeferred: break;  // a backend's answer (backend.h), never a call's result
  }
  return "device_error";
}

namespace {

std::atomic<NvtxRangeHook> g_nvtx_hook{nullptr};
std::atomic<NvtxIdHook> g_nvtx_id_hook{nullptr};
std::atomic<NvtxTextHook> g_nvtx_text_hook{nullptr};

__attribute__((tls_model("initial-exec"))) thread_local int t_tid = 0;
__attribute__((tls_model("initial-exec"))) thread_local int t_tid_pid = 0;

inline int cached_tid(int pid) noexcept {
  if (t_tid_pid != pid) {
    t_tid = static_cast<int>(::syscall(SYS_gettid));
    t_tid_pid = pid;
  }
  return t_tid;
}

constexpr std::uint8_t kFlagAsync = 1;
constexpr std::uint8_t kFlagHit = 2;
constexpr std::size_t kBufferCapacity = std::size_t{1} << 20;
constexpr std::size_t kMaxLine = 4096;  // a record's line is at most ~1.6 KB (64 frames)
constexpr long kIdleWaitNs = 20 * 1000 * 1000;
constexpr long kTricklePauseNs = 100 * 1000;  // a lane fills in >= ~1 ms at 16384 records
constexpr std::size_t kBusyPass = 1024;        // records in a pass that mean "behind"
constexpr std::uint64_t kReleaseBatch = 64;

const char* result_name(std::uint8_t r) noexcept { return trace_result_name(static_cast<Status>(r)); }

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, long ns) noexcept {
  timespec ts{ns / 1000000000, ns % 1000000000};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts,
            nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>* word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
}

void sleep_ns(long ns) noexcept {
  timespec ts{0, ns};
  nanosleep(&ts, nullptr);  // async-signal-safe
}

// The length of the well-formed UTF-8 character at s (at most n bytes there), or 0 when the
// bytes there are not one (a stray byte, an overlong form, a surrogate, or one cut short).
// The trace is UTF-8 text: a program's bytes that are not (a Latin-1 file name in its command
// line, an NVTX name cut at 64 bytes mid-character) are written as '?'.
std::size_t utf8_char_len(const unsigned char* s, std::size_t n) noexcept {
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (std::size_t i = 2; i < len; ++i) {
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  }
  return len;
}

// Walks s[0, n): whole(p, len) for each well-formed multi-byte character, byte(c) for every
// other byte (ASCII, or c >= 0x80 when it is not part of one). No allocation.
template <typename Whole, typename Byte>
void walk_utf8(const unsigned char* s, std::size_t n, Whole&& whole, Byte&& byte) noexcept {
  for (std::size_t i = 0; i < n;) {
    if (const std::size_t len = utf8_char_len(s + i, n - i); len > 1) {
      whole(s + i, len);
      i += len;
    } else {
      byte(s[i++]);
    }
  }
}

// --- formatting into a caller's buffer: no allocation, async-signal-safe.
struct Out {
  char* p;
  void str(const char* s) noexcept {
    while (*s != '\0') *p++ = *s++;
  }
  void ch(char c) noexcept { *p++ = c; }
  void u64(std::uint64_t v) noexcept { p = std::to_chars(p, p + 24, v).ptr; }
  void i64(std::int64_t v) noexcept { p = std::to_chars(p, p + 24, v).ptr; }
  void hex(std::uint64_t v) noexcept {
    *p++ = '0';
    *p++ = 'x';
    p = std::to_chars(p, p + 20, v, 16).ptr;
  }
};

}  // namespace

struct TraceWriter::Impl {
  explicit Impl(std::size_t capacity, std::size_t stack_depth, std::size_t nvtx_bytes,
                TraceClockSource source)
      : lanes(capacity, stack_depth, nvtx_bytes), clock(source), ticks(clock.tsc()) {}
  LaneSet lanes;
  // Read on every record by every allocating thread, written only at open: a line of their own,
  // so that the writer thread's bookkeeping never takes it from the allocating cores (while it
  // shared one with lane_failures_reported, perf put most of on_event's time on reading id).
  alignas(64) std::size_t wake_mask = 0;
  std::uint64_t id = 0;                       // tells this writer's lanes from an older writer's
  TraceClock clock;
  alignas(64) std::atomic<std::uint64_t> lane_failures{0};  // records of a thread that got no lane
  std::atomic<std::uint64_t> lane_failures_reported{0};
  std::unique_ptr<char[]> buf;  // formatted lines not yet written
  std::size_t buf_len = 0;
  pthread_t thread{};
  std::vector<std::uint64_t> cursor;  // drain_locked's per-lane positions (consumer only)
  std::vector<std::uint64_t> limit;
  TickConverter ticks;  // consumer only
  // Write failures (a full disk): consumer only, but for the totals read at exit.
  std::uint64_t file_size = 0;        // bytes in the file, always whole lines
  std::uint64_t lost_pending = 0;     // records refused by the file system, not yet counted in it
  std::atomic<std::uint64_t> lost_total{0};
  int write_errno = 0;                // the first refusal's errno (0: none yet)
  std::atomic<bool> write_error_due{false};  // a first refusal to log, outside the consumer lock
};

namespace {

std::atomic<std::uint64_t> g_next_writer_id{1};

// The calling thread's lane: raw pointers for the hot path (initial-exec TLS: no call, and no
// dependency on the dynamic loader's __tls_get_addr), and a heap handle that owns the lane and
// orphans it when the thread exits (a pthread key destructor: a thread_local with a destructor
// would need a TLS guard variable, which is not initial-exec).
__attribute__((tls_model("initial-exec"))) thread_local std::uint64_t t_lane_writer = 0;
__attribute__((tls_model("initial-exec"))) thread_local TraceLane* t_lane = nullptr;

struct LaneHandle {
  std::shared_ptr<TraceLane> lane;
  void reset(std::shared_ptr<TraceLane> next) noexcept {
    if (lane) lane->state.store(TraceLane::kOrphaned, std::memory_order_release);
    lane = std::move(next);
  }
};
__attribute__((tls_model("initial-exec"))) thread_local LaneHandle* t_lane_handle = nullptr;

pthread_key_t g_lane_key;
pthread_once_t g_lane_key_once = PTHREAD_ONCE_INIT;

void lane_thread_exit(void* handle) noexcept {
  t_lane = nullptr;
  t_lane_writer = 0;
  t_lane_handle = nullptr;
  auto* h = static_cast<LaneHandle*>(handle);
  h->reset(nullptr);
  delete h;
}

void make_lane_key() noexcept { (void)pthread_key_create(&g_lane_key, &lane_thread_exit); }

}  // namespace

namespace {
std::atomic<TraceWriter::WriteFn> g_write_fn{&::write};
std::atomic<TraceWriter::MessageHook> g_message_hook{nullptr};

const char* lost_reason(int err) noexcept { return err == ENOSPC || err == EDQUOT ? "disk_full" : "write_error"; }

// Count of record lines (not '#' comments) in whole lines of data[0, n).
std::uint64_t record_lines(const char* data, std::size_t n) noexcept {
  std::uint64_t count = 0;
  bool line_start = true, record = false;
  for (std::size_t i = 0; i < n; ++i) {
    if (line_start) record = data[i] != '#';
    line_start = data[i] == '\n';
    if (line_start && record) ++count;
  }
  return count;
}
}  // namespace

void TraceWriter::set_write_for_testing(WriteFn fn) noexcept {
  g_write_fn.store(fn != nullptr ? fn : &::write, std::memory_order_release);
}

void TraceWriter::set_message_hook(MessageHook hook) noexcept { g_message_hook.store(hook, std::memory_order_release); }

std::uint64_t TraceWriter::lost_total() const noexcept { return impl_->lost_total.load(std::memory_order_relaxed); }

namespace {
std::atomic<TraceWriter*> g_signal_writer{nullptr};
struct sigaction g_previous[NSIG];
std::atomic<bool> g_in_signal_flush{false};
constexpr int kFatalSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGTERM, SIGINT};
}  // namespace

void TraceWriter::set_nvtx_hook(NvtxRangeHook hook) noexcept {
  g_nvtx_hook.store(hook, std::memory_order_release);
}

void TraceWriter::set_nvtx_id_hooks(NvtxIdHook current, NvtxTextHook text) noexcept {
  // Text first: an id recorded once `current` is visible can always be resolved.
  if (text != nullptr) g_nvtx_text_hook.store(text, std::memory_order_release);
  g_nvtx_id_hook.store(current, std::memory_order_release);
}

namespace {
std::size_t lane_capacity(std::size_t wanted) noexcept {
  std::size_t cap = 2;
  while (cap < wanted) cap <<= 1;
  return cap;
}
}  // namespace

TraceWriter::TraceWriter(std::string base_path, const TraceOptions& options)
    : base_path_(std::move(base_path)),
      options_(options),
      impl_(std::make_unique<Impl>(
          lane_capacity(options.ring_capacity),
          options.stack_depth > kMaxStackDepth ? kMaxStackDepth : options.stack_depth,
          options.nvtx ? kMaxNvtx : 0, options.clock)) {
  if (options_.stack_depth > kMaxStackDepth) options_.stack_depth = kMaxStackDepth;
  options_.ring_capacity = lane_capacity(options_.ring_capacity);
  const std::size_t cap = options_.ring_capacity;
  impl_->wake_mask = cap >= 16 ? cap / 4 - 1 : 0;
  impl_->id = g_next_writer_id.fetch_add(1, std::memory_order_relaxed);
  impl_->buf.reset(new char[kBufferCapacity]);
  impl_->cursor.resize(LaneSet::kMaxLanes);
  impl_->limit.resize(LaneSet::kMaxLanes);
  pid_ = static_cast<int>(::getpid());
}

std::unique_ptr<TraceWriter> TraceWriter::open(const std::string& path, const TraceOptions& options,
                                               std::string* error) {
  auto fail = [&](std::string why) -> std::unique_ptr<TraceWriter> {
    if (error != nullptr) *error = std::move(why);
    return nullptr;
  };
  if (::getauxval(AT_SECURE) != 0) {
    return fail("cudalloc: tracing is disabled in secure-execution (setuid/setgid) processes");
  }
  if (path.empty()) return fail("cudalloc: empty trace path");
  std::unique_ptr<TraceWriter> w(new TraceWriter(path, options));
  std::string why;
  if (!w->open_file(true, &why)) return fail(why);
  if (w->options_.stack_depth > 0) {
    // The first backtrace() loads libgcc_s and allocates: do it here, not on the hot path.
    void* warm[4];
    (void)::backtrace(warm, 4);
  }
  w->write_header();
  return w;
}

bool TraceWriter::open_file(bool allow_base, std::string* error) {
  // The rules of trace/owned_file.h: created 0600 and exclusively, or else an existing regular
  // file of this user's with one name; never a symlink, a FIFO, or another user's file.
  auto open_owned = [&](const std::string& p) -> int {
    std::string why;
    const int fd = open_owned_file(p, 0, 0600, &why);
    if (fd < 0) *error = "cudalloc: trace path " + p + " " + why + "; not tracing";
    return fd;
  };
  auto truncate = [&](int fd, const std::string& p) -> bool {
    if (::ftruncate(fd, 0) == 0) return true;
    *error = "cudalloc: cannot truncate trace " + p + ": " + std::strerror(errno);
    ::close(fd);
    return false;
  };
  if (allow_base) {
    const int fd = open_owned(base_path_);
    if (fd < 0) return false;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      if (!truncate(fd, base_path_)) return false;  // sequential runs overwrite their trace
      fd_ = fd;
      file_path_ = base_path_;
      return true;
    }
    ::close(fd);  // another live process writes `path`
  }
  std::string p = base_path_ + "." + std::to_string(pid_);
  const int fd = open_owned(p);
  if (fd < 0 || !truncate(fd, p)) return false;
  (void)::flock(fd, LOCK_EX | LOCK_NB);
  fd_ = fd;
  file_path_ = p;
  return true;
}

// Whole lines only, so that the file always ends with one: a refused write (a full disk, a file
// size limit) cuts the file back to the last whole line it wrote and counts the records it
// lost. Once the file system takes lines again, a `dropped` record with reason=disk_full says
// how many were lost, so a reader does not take the gap for a process killed mid-write.
// Async-signal-safe (the fatal-signal flush writes through here): no allocation, no log.
void TraceWriter::write_out(const char* data, std::size_t n) noexcept {
  if (fd_ < 0 || n == 0) return;
  if (write_lines(data, n) && impl_->lost_pending != 0) write_lost_record();
}

bool TraceWriter::write_lines(const char* data, std::size_t n) noexcept {
  Impl& im = *impl_;
  const WriteFn write_fn = g_write_fn.load(std::memory_order_acquire);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = write_fn(fd_, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : ENOSPC;
      std::size_t keep = done;
      while (keep > 0 && data[keep - 1] != '\n') --keep;
      im.file_size += keep;
      if (keep != done) {
        (void)::ftruncate(fd_, static_cast<off_t>(im.file_size));
        (void)::lseek(fd_, static_cast<off_t>(im.file_size), SEEK_SET);
      }
      const std::uint64_t lost = record_lines(data + keep, n - keep);
      im.lost_pending += lost;
      im.lost_total.fetch_add(lost, std::memory_order_relaxed);
      if (im.write_errno == 0) {
        im.write_errno = err;
        im.write_error_due.store(true, std::memory_order_release);
      }
      return false;
    }
    done += static_cast<std::size_t>(w);
  }
  im.file_size += n;
  return true;
}

// `dropped` with the count of records the file system refused (format_record's layout).
void TraceWriter::write_lost_record() noexcept {
  Impl& im = *impl_;
  char line[160];
  Out o{line};
  o.i64(im.ticks.now_ns());
  o.ch(',');
  o.i64(pid_);
  o.str(",0,-1,dropped,-,0x0,0,0,ok,0,0,0,count=");
  o.u64(im.lost_pending);
  o.str(";reason=");
  o.str(lost_reason(im.write_errno));
  o.ch('\n');
  const std::uint64_t pending = im.lost_pending;
  im.lost_pending = 0;
  if (!write_lines(line, static_cast<std::size_t>(o.p - line))) {
    // Refused too: its own line is not a record that was lost, the count it carried still is.
    im.lost_pending += pending - 1;
    im.lost_total.fetch_sub(1, std::memory_order_relaxed);
  }
}

// Outside the consumer lock and never from a signal handler: the hook may log.
void TraceWriter::report_write_errors(bool at_exit) noexcept {
  Impl& im = *impl_;
  char msg[512];
  if (im.write_error_due.exchange(false, std::memory_order_acq_rel)) {
    std::snprintf(msg, sizeof msg,
                  "trace %s: the file system refused a write (%s); records are lost until it takes them "
                  "again, and the trace will say how many",
                  file_path_.c_str(), std::strerror(im.write_errno));
    emit_message(msg);
  }
  const std::uint64_t lost = im.lost_total.load(std::memory_order_relaxed);
  if (at_exit && lost != 0) {
    std::snprintf(msg, sizeof msg, "trace %s: %llu records lost: %s", file_path_.c_str(),
                  static_cast<unsigned long long>(lost),
                  std::strcmp(lost_reason(im.write_errno), "disk_full") == 0 ? "disk full" : "write error");
    emit_message(msg);
  }
}

void TraceWriter::emit_message(const char* msg) noexcept {
  if (MessageHook hook = g_message_hook.load(std::memory_order_acquire)) {
    hook(msg);
    return;
  }
  std::fprintf(stderr, "cudalloc: %s\n", msg);
}

void TraceWriter::flush_buffer() noexcept {
  if (impl_->buf_len > 0) write_out(impl_->buf.get(), impl_->buf_len);
  impl_->buf_len = 0;
}

void TraceWriter::write_header() noexcept {
  try {
    std::string h = "#cudalloc-trace v1\n"
                    "ts_ns,pid,tid,device,event,stream,ptr,requested,rounded,result,hit,"
                    "allocated,reserved,extra\n";
    h += "# pid=" + std::to_string(pid_) + " ppid=" + std::to_string(::getppid()) + "\n";
    std::string cmd;
    int cfd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (cfd >= 0) {
      char tmp[4096];
      ssize_t n;
      while ((n = ::read(cfd, tmp, sizeof tmp)) > 0 && cmd.size() < 16384) cmd.append(tmp, n);
      ::close(cfd);
    }
    while (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
    std::string line;
    walk_utf8(
        reinterpret_cast<const unsigned char*>(cmd.data()), cmd.size(),
        [&](const unsigned char* p, std::size_t len) { line.append(reinterpret_cast<const char*>(p), len); },
        [&](unsigned char c) {
          line += c == '\0' ? ' ' : (c == '\n' || c == '\r' || c >= 0x80) ? '?' : static_cast<char>(c);
        });
    h += "# cmdline=" + line + "\n";
    timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    std::int64_t mono = monotonic_ns();
    // The wall-clock time of ts_ns = 0.
    std::int64_t origin_rt_ns = static_cast<std::int64_t>(rt.tv_sec) * 1000000000 + rt.tv_nsec -
                                (mono - trace_origin_ns());
    time_t secs = static_cast<time_t>(origin_rt_ns / 1000000000);
    struct tm tmv;
    gmtime_r(&secs, &tmv);
    char when[64];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tmv);
    char frac[16];
    std::snprintf(frac, sizeof frac, ".%06lldZ",
                  static_cast<long long>((origin_rt_ns % 1000000000) / 1000));
    h += std::string("# start_time=") + when + frac + " origin_realtime_ns=" +
         std::to_string(origin_rt_ns) + " origin_monotonic_ns=" + std::to_string(trace_origin_ns()) +
         "\n";
    h += "# options stack_depth=" + std::to_string(options_.stack_depth) +
         " nvtx=" + (options_.nvtx ? "1" : "0") +
         " ring_capacity=" + std::to_string(options_.ring_capacity) +
         " clock=" + (impl_->clock.tsc() ? "tsc" : "monotonic") + "\n";
    write_out(h.data(), h.size());
  } catch (...) {
  }
  if (options_.stack_depth > 0) write_maps();
}

// Executable file mappings, so the reader can symbolize raw PCs: `#map <a line of /proc/PID/maps>`.
void TraceWriter::write_maps() noexcept {
  try {
    int mfd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (mfd < 0) return;
    std::string all;
    char tmp[16384];
    ssize_t n;
    while ((n = ::read(mfd, tmp, sizeof tmp)) > 0) all.append(tmp, n);
    ::close(mfd);
    std::string out;
    std::size_t start = 0;
    while (start < all.size()) {
      std::size_t end = all.find('\n', start);
      if (end == std::string::npos) end = all.size();
      std::string_view line(all.data() + start, end - start);
      // "start-end perms offset dev inode path": keep file-backed mappings (path starts with /).
      std::size_t slash = line.find('/');
      if (slash != std::string_view::npos && line.find(' ') < slash) {
        out += "#map ";
        out += line;
        out += '\n';
      }
      start = end + 1;
    }
    write_out(out.data(), out.size());
  } catch (...) {
  }
}

void TraceWriter::on_event(const AllocatorEvent& e) noexcept {
  if (disabled_.load(std::memory_order_relaxed)) return;

  // Gather what is expensive before claiming a slot.
  void* frames[kMaxStackDepth + 1];
  int nframes = 0;
  const std::size_t depth = options_.stack_depth;
  if (depth > 0) {
    nframes = ::backtrace(frames, static_cast<int>(depth) + 1) - 1;  // drop on_event itself
    if (nframes < 0) nframes = 0;
  }
  char nv[kMaxNvtx];
  std::size_t nv_len = 0;
  std::uint32_t nv_id = 0;
  if (options_.nvtx || options_.phases) {
    if (NvtxIdHook id_hook = g_nvtx_id_hook.load(std::memory_order_acquire)) {
      nv_id = id_hook();  // a thread-local read; the writer thread makes the text
    } else if (!options_.nvtx) {
      // Phases only, and no id hook: nothing to record.
    } else if (NvtxRangeHook hook = g_nvtx_hook.load(std::memory_order_acquire)) {
      nv_len = hook(nv, kMaxNvtx);
      if (nv_len > kMaxNvtx) nv_len = kMaxNvtx;
    }
  }
  const std::int64_t ts = e.local ? impl_->clock.stamp_local() : impl_->clock.stamp();
  const int tid = cached_tid(pid_);

  TraceLane* lane = t_lane;
  if (t_lane_writer != impl_->id) lane = attach_lane();
  const std::size_t slot = lane != nullptr ? lane->try_claim() : TraceLane::kFull;
  if (slot == TraceLane::kFull) {
    if (lane == nullptr) impl_->lane_failures.fetch_add(1, std::memory_order_relaxed);
    wake_writer();
    if (thread_state_.load(std::memory_order_relaxed) == 0) start_thread();
    return;
  }
  TraceRecord& r = lane->record(slot);
  r.ts = lane->order_stamp(ts);
  r.ptr = e.ptr;
  r.stream = e.stream;
  r.requested = e.requested;
  r.rounded = e.rounded;
  r.allocated = e.allocated_after;
  r.reserved = e.reserved_after;
  r.tid = tid;
  r.device = e.device;
  r.nvtx_id = nv_id;
  r.kind = static_cast<std::uint8_t>(e.kind);
  r.result = static_cast<std::uint8_t>(e.result);
  r.flags = static_cast<std::uint8_t>((e.async ? kFlagAsync : 0) | (e.cache_hit ? kFlagHit : 0));
  r.nstack = static_cast<std::uint8_t>(nframes);
  r.nvtx_len = static_cast<std::uint8_t>(nv_len);
  if (nframes > 0) {
    std::uintptr_t* dst = lane->pcs(slot);
    for (int i = 0; i < nframes; ++i) dst[i] = reinterpret_cast<std::uintptr_t>(frames[i + 1]);
  }
  if (nv_len > 0) std::memcpy(lane->nvtx(slot), nv, nv_len);
  const std::uint64_t pos = lane->publish();

  if ((pos & impl_->wake_mask) == 0) wake_writer();
  if (thread_state_.load(std::memory_order_relaxed) == 0) start_thread();
}

// Only the first producer to find the writer asleep makes the system call: it clears the flag
// before waking, and a futex_wait that has not started yet returns at once on the cleared flag.
// (A wake per record, while the writer slept or had not yet run, would cost a system call per
// dropped record, several times the pair itself with a full lane.)
void TraceWriter::wake_writer() noexcept {
  if (writer_sleeping_.load(std::memory_order_relaxed) != 0 &&
      writer_sleeping_.exchange(0, std::memory_order_acq_rel) != 0) {
    futex_wake(&writer_sleeping_);
  }
}

// The calling thread's first record for this writer (or its first since it recorded for
// another one): take a lane. Once per thread, off the hot path.
TraceLane* TraceWriter::attach_lane() noexcept {
  if (t_lane_handle == nullptr) {
    (void)pthread_once(&g_lane_key_once, &make_lane_key);
    auto* handle = new (std::nothrow) LaneHandle;
    if (handle == nullptr) return nullptr;
    t_lane_handle = handle;
    (void)pthread_setspecific(g_lane_key, handle);
  }
  std::shared_ptr<TraceLane> lane = impl_->lanes.acquire();
  if (!lane) return nullptr;
  TraceLane* raw = lane.get();
  t_lane_handle->reset(std::move(lane));
  t_lane = raw;
  t_lane_writer = impl_->id;
  return raw;
}

// Consumer side. One drainer at a time (the writer thread, flush(), or a signal handler).
bool TraceWriter::lock_consumer(bool from_signal) noexcept {
  // A signal handler gives up after ~200 ms (the holder may be the interrupted thread itself).
  const int tries = from_signal ? 200 : 5000;
  for (int i = 0; i < tries; ++i) {
    bool expected = false;
    if (consumer_busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
      return true;
    }
    sleep_ns(1000000);
  }
  return false;
}

void TraceWriter::unlock_consumer() noexcept {
  consumer_busy_.store(false, std::memory_order_release);
}

namespace {

void line_prefix(Out& o, std::int64_t ts, int pid, int tid, int device) noexcept {
  o.i64(ts);
  o.ch(',');
  o.i64(pid);
  o.ch(',');
  o.i64(tid);
  o.ch(',');
  o.i64(device);
  o.ch(',');
}

// Formats one record as a line at `o`.
void format_record(Out& o, std::int64_t ts_ns, int pid, std::size_t depth, const TraceRecord& r,
                   const std::uintptr_t* pcs, const char* nvtx_text, TraceOptions::StreamLabel label) noexcept {
  line_prefix(o, ts_ns, pid, r.tid, r.device);
  const auto kind = static_cast<EventKind>(r.kind);
  o.str(to_string(kind));
  o.ch(',');
  const bool passthrough = kind == EventKind::kPassthroughAlloc || kind == EventKind::kPassthroughFree;
  if (r.stream == kNoStream) o.ch('-');
  else o.hex(label != nullptr && !passthrough ? label(r.stream) : r.stream);
  o.ch(',');
  o.hex(r.ptr);
  o.ch(',');
  o.u64(r.requested);
  o.ch(',');
  o.u64(r.rounded);
  o.ch(',');
  o.str(result_name(r.result));
  o.ch(',');
  o.ch((r.flags & kFlagHit) != 0 ? '1' : '0');
  o.ch(',');
  o.u64(r.allocated);
  o.ch(',');
  o.u64(r.reserved);
  o.ch(',');
  bool sep = false;
  if ((r.flags & kFlagAsync) != 0) {
    o.str("async=1");
    sep = true;
  }
  const char* s = nullptr;
  std::size_t nv_len = 0;
  if (r.nvtx_id != 0) {
    if (NvtxTextHook text = g_nvtx_text_hook.load(std::memory_order_acquire)) {
      nv_len = text(r.nvtx_id, &s);
      if (s == nullptr) nv_len = 0;
      if (nv_len > TraceWriter::kMaxNvtx) nv_len = TraceWriter::kMaxNvtx;
    }
  } else if (r.nvtx_len > 0) {
    s = nvtx_text;
    nv_len = r.nvtx_len;
  }
  if (nv_len > 0) {
    if (sep) o.ch(';');
    o.str("nvtx=");
    walk_utf8(
        reinterpret_cast<const unsigned char*>(s), nv_len,
        [&](const unsigned char* p, std::size_t len) {
          for (std::size_t k = 0; k < len; ++k) o.ch(static_cast<char>(p[k]));
        },
        [&](unsigned char c) {
          // Keep the record one line of comma-separated fields.
          o.ch((c < 0x20 || c == 0x7f || c == ',' || c == ';') ? '_' : c >= 0x80 ? '?' : static_cast<char>(c));
        });
    sep = true;
  }
  if (r.nstack > 0 && depth > 0) {
    if (sep) o.ch(';');
    o.str("stack=");
    for (std::size_t i = 0; i < r.nstack && i < depth; ++i) {
      if (i > 0) o.ch('/');
      o.hex(pcs[i]);
    }
  }
  o.ch('\n');
}

}  // namespace

// Takes the published records of every lane and writes them merged by timestamp, then one
// `dropped` record for what the lanes dropped meanwhile. Returns whether anything was written.
//
// Order: a pass takes only records stamped before `cutoff`, a time read before any lane's head.
// If record X on one thread made record Y on another possible (a free, then the allocation that
// reuses the block), X was published before Y was stamped. So if Y is taken, X was published
// before the cutoff, hence before its lane's head was read, and is taken too; merged by time, it
// comes first. flush(), finish() and the signal handler take everything (final_pass).
std::size_t TraceWriter::drain_locked(bool final_pass) noexcept {
  Impl& im = *impl_;
  std::size_t taken = 0;
  auto room = [&]() {
    if (im.buf_len + kMaxLine > kBufferCapacity) flush_buffer();
  };
  // Taken on final passes too: it also refreshes the conversion of ticks to ns.
  const std::int64_t now = im.ticks.anchor_now();
  const std::int64_t cutoff = final_pass ? INT64_MAX : now;
  const std::size_t n = im.lanes.count();
  // The vectors are sized up front (reserve in the constructor) so this never allocates in a
  // signal handler; lanes beyond their size are taken on the next pass.
  const std::size_t lanes = n < im.cursor.size() ? n : im.cursor.size();
  for (std::size_t i = 0; i < lanes; ++i) {
    TraceLane* lane = im.lanes.at(i);
    im.cursor[i] = lane->tail();
    im.limit[i] = lane->head();
  }
  for (;;) {
    // The lane whose next record is the oldest. A handful of lanes: a scan beats a heap.
    std::size_t best = lanes;
    std::int64_t best_ts = cutoff;
    for (std::size_t i = 0; i < lanes; ++i) {
      if (im.cursor[i] == im.limit[i]) continue;
      TraceLane* lane = im.lanes.at(i);
      const std::int64_t ts = lane->record(lane->slot(im.cursor[i])).ts;
      if (ts < best_ts) {
        best = i;
        best_ts = ts;
      }
    }
    if (best == lanes) break;
    TraceLane* lane = im.lanes.at(best);
    const std::size_t slot = lane->slot(im.cursor[best]);
    room();
    Out o{im.buf.get() + im.buf_len};
    format_record(o, im.ticks.to_ns(best_ts), pid_, options_.stack_depth, lane->record(slot), lane->pcs(slot),
                  lane->nvtx(slot), options_.stream_label);
    im.buf_len = static_cast<std::size_t>(o.p - im.buf.get());
    // The producer reads the tail only when its lane looks full: hand space back in batches,
    // so that line does not move between the cores on every record.
    if ((++im.cursor[best] & (kReleaseBatch - 1)) == 0) lane->release_until(im.cursor[best]);
    ++taken;
  }
  for (std::size_t i = 0; i < lanes; ++i) im.lanes.at(i)->release_until(im.cursor[i]);
  written_total_.fetch_add(taken, std::memory_order_relaxed);
  std::uint64_t lost = 0;
  for (std::size_t i = 0; i < lanes; ++i) {
    TraceLane* lane = im.lanes.at(i);
    lost += lane->take_new_drops();
    // A lane whose thread exited is free for the next thread once nothing of it is left.
    int orphaned = TraceLane::kOrphaned;
    if (lane->state.load(std::memory_order_acquire) == orphaned &&
        lane->tail() == lane->head()) {
      lane->state.compare_exchange_strong(orphaned, TraceLane::kFree, std::memory_order_acq_rel);
    }
  }
  const std::uint64_t failures = im.lane_failures.load(std::memory_order_relaxed);
  const std::uint64_t reported = im.lane_failures_reported.load(std::memory_order_relaxed);
  if (failures != reported) {
    lost += failures - reported;
    im.lane_failures_reported.store(failures, std::memory_order_relaxed);
  }
  if (lost != 0) {
    room();
    Out o{im.buf.get() + im.buf_len};
    line_prefix(o, im.ticks.now_ns(), pid_, 0, -1);
    o.str("dropped,-,0x0,0,0,ok,0,0,0,count=");
    o.u64(lost);
    o.ch('\n');
    im.buf_len = static_cast<std::size_t>(o.p - im.buf.get());
  }
  return taken;
}

// Whether a drain would find anything (the writer thread's check before it sleeps).
bool TraceWriter::work_pending() const noexcept {
  const Impl& im = *impl_;
  const std::size_t n = im.lanes.count();
  for (std::size_t i = 0; i < n; ++i) {
    const TraceLane* lane = im.lanes.at(i);
    if (lane->head() != lane->tail()) return true;
  }
  return im.lane_failures.load(std::memory_order_relaxed) !=
         im.lane_failures_reported.load(std::memory_order_relaxed);
}

std::size_t TraceWriter::lanes_for_testing() const noexcept { return impl_->lanes.count(); }

std::uint64_t TraceWriter::dropped_total() const noexcept {
  const Impl& im = *impl_;
  std::uint64_t n = im.lane_failures.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < im.lanes.count(); ++i) n += im.lanes.at(i)->dropped_ever();
  return n;
}

void* TraceWriter::thread_entry(void* self) noexcept {
  static_cast<TraceWriter*>(self)->thread_main();
  return nullptr;
}

void TraceWriter::thread_main() noexcept {
  // Named, so that top and perf tell it from the program's threads.
  pthread_setname_np(pthread_self(), "cudalloc-trace");
  while (!stop_.load(std::memory_order_acquire)) {
    std::size_t taken = 0;
    if (!paused_.load(std::memory_order_relaxed) && lock_consumer(false)) {
      taken = drain_locked(false);
      flush_buffer();
      unlock_consumer();
      if (impl_->write_error_due.load(std::memory_order_relaxed)) report_write_errors(false);
    }
    if (taken >= kBusyPass) continue;  // behind: keep going
    if (taken > 0 && !paused_.load(std::memory_order_relaxed)) {
      // A trickle: let the records build up and take them in one pass. Reading lines a thread
      // has just written, record by record, would bounce them between the two cores and slow
      // down the allocating thread.
      sleep_ns(kTricklePauseNs);
      continue;
    }
    writer_sleeping_.store(1, std::memory_order_seq_cst);
    // Re-check after announcing sleep so a wake between the drain and here is not lost.
    const bool pending = work_pending();
    if ((!pending || paused_.load(std::memory_order_relaxed)) &&
        !stop_.load(std::memory_order_acquire)) {
      futex_wait(&writer_sleeping_, 1, kIdleWaitNs);
    }
    writer_sleeping_.store(0, std::memory_order_relaxed);
  }
}

void TraceWriter::start_thread() noexcept {
  int expected = 0;
  if (!thread_state_.compare_exchange_strong(expected, 1)) return;
  // The writer thread takes no asynchronous signals: they belong to the program's threads.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&impl_->thread, nullptr, &TraceWriter::thread_entry, this);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) thread_state_.store(3);  // no thread: flush() at exit still writes the ring
}

void TraceWriter::stop_thread() noexcept {
  if (thread_state_.load() != 1) return;
  stop_.store(true, std::memory_order_release);
  writer_sleeping_.store(0);
  futex_wake(&writer_sleeping_);
  pthread_join(impl_->thread, nullptr);
  thread_state_.store(0);
  stop_.store(false);
}

void TraceWriter::flush() noexcept {
  if (fd_ < 0 || static_cast<int>(::getpid()) != pid_) return;  // a child that kept our copy
  if (!lock_consumer(false)) return;
  drain_locked(true);
  flush_buffer();
  if (options_.stack_depth > 0) write_maps();  // libraries loaded since open()
  unlock_consumer();
  if (impl_->write_error_due.load(std::memory_order_relaxed)) report_write_errors(false);
}

TraceWriter::~TraceWriter() {
  TraceWriter* self = this;
  g_signal_writer.compare_exchange_strong(self, nullptr);
  if (static_cast<int>(::getpid()) != pid_) {
    // A fork child that never called after_fork_child(): the thread and the records are the
    // parent's. Write nothing.
    if (fd_ >= 0) ::close(fd_);
    return;
  }
  stop_thread();
  finish();
  if (fd_ >= 0) ::close(fd_);
}

void TraceWriter::finish() noexcept {
  if (fd_ < 0 || static_cast<int>(::getpid()) != pid_) return;
  if (finished_.exchange(true)) return;
  if (!lock_consumer(false)) return;
  drain_locked(true);
  flush_buffer();
  if (options_.stack_depth > 0) write_maps();
  if (impl_->lost_pending != 0) write_lost_record();
  char end[160];
  Out o{end};
  o.str("# end records=");
  o.u64(written_total_.load());
  o.str(" dropped=");
  o.u64(dropped_total());
  if (const std::uint64_t lost = impl_->lost_total.load(std::memory_order_relaxed); lost != 0) {
    o.str(" lost=");
    o.u64(lost);
  }
  o.ch('\n');
  write_out(end, static_cast<std::size_t>(o.p - end));
  unlock_consumer();
  report_write_errors(true);
}

void TraceWriter::after_fork_child() noexcept {
  // Only this thread exists in the child: nothing else touches the writer.
  thread_state_.store(0);
  stop_.store(false);
  consumer_busy_.store(false);
  writer_sleeping_.store(0);
  written_total_.store(0);
  // Every lane but this thread's belonged to a thread that does not exist here.
  for (std::size_t i = 0; i < impl_->lanes.count(); ++i) {
    TraceLane* lane = impl_->lanes.at(i);
    lane->discard_all();
    if (lane != t_lane || t_lane_writer != impl_->id) {
      lane->state.store(TraceLane::kOrphaned, std::memory_order_relaxed);
    }
  }
  impl_->lane_failures.store(0);
  impl_->lane_failures_reported.store(0);
  impl_->buf_len = 0;
  impl_->file_size = 0;
  impl_->lost_pending = 0;
  impl_->lost_total.store(0);
  impl_->write_errno = 0;
  impl_->write_error_due.store(false);
  finished_.store(false);
  if (fd_ >= 0) ::close(fd_);  // the parent's file (its lock stays with the parent)
  fd_ = -1;
  pid_ = static_cast<int>(::getpid());
  std::string why;
  bool ok = false;
  try {
    ok = open_file(false, &why);
  } catch (...) {
  }
  if (!ok) {
    disabled_.store(true);
    return;
  }
  write_header();
}

// --- fatal signals
void trace_signal_handler(int sig, void* info_v, void* ctx) {
  auto* info = static_cast<siginfo_t*>(info_v);
  int saved_errno = errno;
  TraceWriter* w = g_signal_writer.load(std::memory_order_acquire);
  bool expected = false;
  if (w != nullptr && w->fd_ >= 0 && static_cast<int>(::getpid()) == w->pid_ &&
      g_in_signal_flush.compare_exchange_strong(expected, true)) {
    if (w->lock_consumer(true)) {
      w->drain_locked(true);
      w->flush_buffer();
      char note[64];
      Out o{note};
      o.str("# signal ");
      o.i64(sig);
      o.ch('\n');
      w->write_out(note, static_cast<std::size_t>(o.p - note));
      w->unlock_consumer();
    }
    g_in_signal_flush.store(false);
  }
  errno = saved_errno;
  // Chain to what was installed before.
  const struct sigaction& prev = g_previous[sig];
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, ctx);
  } else if (prev.sa_handler == SIG_IGN) {
    return;
  } else if (prev.sa_handler == SIG_DFL || prev.sa_handler == nullptr) {
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);  // pending until this handler returns, then the default action
  } else {
    prev.sa_handler(sig);
  }
}

namespace {
extern "C" void trace_signal_trampoline(int sig, siginfo_t* info, void* ctx) {
  trace_signal_handler(sig, info, ctx);
}
}  // namespace

void TraceWriter::install_fatal_signal_flush() {
  TraceWriter* prev_writer = g_signal_writer.exchange(this, std::memory_order_acq_rel);
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;  // handlers already in place; they use the new writer
  (void)prev_writer;
  for (int sig : kFatalSignals) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = &trace_signal_trampoline;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, &g_previous[sig]);
  }
}

}  // namespace cudalloc
