#include "shim/log.h"

#include <spdlog/logger.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <memory>
#include <mutex>

namespace cudalloc::shim {

namespace {

// Heap objects that are never destroyed: messages may come during exit, after static
// destructors ran. The logger is not put in spdlog's registry (a static) for that reason.
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<spdlog::logger*> g_logger{nullptr};
std::mutex* g_make_mutex = new std::mutex;

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

spdlog::logger* make_logger(const std::string& file) {
  spdlog::sink_ptr sink;
  if (!file.empty()) {
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, false);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cudalloc: cannot open CUDALLOC_LOG_FILE %s: %s; logging to stderr\n",
                   file.c_str(), e.what());
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
  g_make_mutex = new std::mutex;
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
