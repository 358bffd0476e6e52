// Security probe: what the configuration, the log and the trace writer do in this process.
//   secure_probe LOG_PATH TRACE_PATH
// Prints AT_SECURE, what load_config() read from CUDALLOC_LOG_FILE / CUDALLOC_TRACE, then
// asks the log (shim/log.cpp) and the trace writer to write to LOG_PATH and TRACE_PATH
// directly. check_security.py runs it setuid-root as an unprivileged user (secure-execution
// mode): no file may appear. Run normally, both files appear (the control).
#include <sys/auxv.h>

#include <cstdio>
#include <string>

#include "config/config.h"
#include "shim/log.h"
#include "trace/trace_writer.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::printf("AT_SECURE=%lu\n", ::getauxval(AT_SECURE));
  const auto cr = cudalloc::load_config(cudalloc::process_env());
  std::printf("config_ok=%d log_file='%s' trace='%s'\n", cr.config.has_value() ? 1 : 0,
              cr.config ? cr.config->log_file.c_str() : "", cr.config ? cr.config->trace_path.c_str() : "");
  cudalloc::shim::log_configure(cudalloc::LogLevel::kWarn, argv[1]);
  cudalloc::shim::log_warn("secure_probe: a warning");
  std::string error;
  auto trace = cudalloc::TraceWriter::open(argv[2], cudalloc::TraceOptions{}, &error);
  std::printf("trace_opened=%d error='%s'\n", trace ? 1 : 0, error.c_str());
  std::fflush(stdout);
  return 0;
}
