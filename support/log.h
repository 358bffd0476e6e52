// cudalloc's log: one line per message, to stderr or CUDALLOC_LOG_FILE, prefixed "cudalloc".
// printf-style so that callers need no formatting library; spdlog stays inside log.cpp.
// Nothing on the hot path of a cached allocate/free logs.
#pragma once

#include <string>

#include "config/config.h"

namespace cudalloc::shim {

// Sets level and destination; before this, warnings and errors go to stderr.
void log_configure(LogLevel level, const std::string& file);
// The child of a fork drops the logger (its lock may be held by a thread that is gone).
void log_reset_after_fork();
bool log_enabled(LogLevel level);

void log_debug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace cudalloc::shim
