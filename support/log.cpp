#include "support/log.h"

#include "trace/owned_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

namespace cudalloc::shim {

namespace {

// Heap objects that are never destroyed: messages may come during exit, after static
// destructors ran. The logger is not put in spdlog's registry (a static) for that reason.
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<spdlog::logger*> g_logger{nullptr};
std::mutex* g_make_mutex = new std::mutex;
// A fork child's fresh mutex, made without the heap (a fork handler must not call it: another
// parent thread may have held the allocator's lock at the fork).
alignas(std::mutex) unsigned char g_child_mutex[sizeof(std::mutex)];

spdlog::level::level_enum to_spdlog(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

// Appends to a file descriptor this library opened itself (see open_log_file).
class FdSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FdSink(int fd) : fd_(fd) {}
  ~FdSink() override { ::close(fd_); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    const char* p = buf.data();
    std::size_t left = buf.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // full disk or the like: the line is lost, the program goes on
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  void flush_() override {}

 private:
  int fd_;
};

// CUDALLOC_LOG_FILE is never written in secure-execution mode, never through a symlink, and
// only to a regular file of this user's that has no other name (trace/owned_file.h): a FIFO
// held open by a process that never reads would block every log line, and a file someone else
// made would receive it. New files are 0600 and close-on-exec. Returns -1 with the reason.
int open_log_file(const std::string& file, std::string* why) {
  if (::getauxval(AT_SECURE) != 0) {
    *why = "log files are not written in secure-execution (setuid/setgid) processes";
    return -1;
  }
  const int fd = open_owned_file(file, O_APPEND, 0600, why);
  if (fd < 0) *why = "it " + *why;
  return fd;
}

spdlog::logger* make_logger(const std::string& file) {
  spdlog::sink_ptr sink;
  if (!file.empty()) {
    std::string why;
    const int fd = open_log_file(file, &why);
    if (fd >= 0) {
      try {
        sink = std::make_shared<FdSink>(fd);
      } catch (const std::exception& e) {
        ::close(fd);
        why = e.what();
      }
    }
    if (!sink) {
      std::fprintf(stderr, "cudalloc: cannot open CUDALLOC_LOG_FILE %s: %s; logging to stderr\n", file.c_str(),
                   why.c_str());
    }
  }
  if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto* logger = new spdlog::logger("cudalloc", std::move(sink));
  logger->set_pattern("cudalloc [%l] %v");
  logger->set_level(spdlog::level::trace);  // filtering is done by g_level
  logger->flush_on(spdlog::level::trace);
  return logger;
}

spdlog::logger* logger() {
  spdlog::logger* l = g_logger.load(std::memory_order_acquire);
  if (l != nullptr) return l;
  std::lock_guard lock(*g_make_mutex);
  l = g_logger.load(std::memory_order_acquire);
  if (l == nullptr) {
    l = make_logger("");
    g_logger.store(l, std::memory_order_release);
  }
  return l;
}

void vlog(LogLevel level, const char* fmt, va_list args) {
  if (!log_enabled(level)) return;
  char buf[2048];
  std::vsnprintf(buf, sizeof buf, fmt, args);
  logger()->log(to_spdlog(level), "{}", buf);
}

}  // namespace

void log_configure(LogLevel level, const std::string& file) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
  if (level == LogLevel::kOff) return;
  std::lock_guard lock(*g_make_mutex);
  g_logger.store(make_logger(file), std::memory_order_release);  // the old one is leaked
}

void log_reset_after_fork() {
  g_make_mutex = new (g_child_mutex) std::mutex;
  g_logger.store(nullptr, std::memory_order_relaxed);
}

bool log_enabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed) && level != LogLevel::kOff;
}

#define CUDALLOC_LOG_FN(fn, lvl)    \
  void fn(const char* fmt, ...) {   \
    va_list args;                   \
    va_start(args, fmt);            \
    vlog(lvl, fmt, args);           \
    va_end(args);                   \
  }
CUDALLOC_LOG_FN(log_debug, LogLevel::kDebug)
CUDALLOC_LOG_FN(log_info, LogLevel::kInfo)
CUDALLOC_LOG_FN(log_warn, LogLevel::kWarn)
CUDALLOC_LOG_FN(log_error, LogLevel::kError)
#undef CUDALLOC_LOG_FN

}  // namespace cudalloc::shim
