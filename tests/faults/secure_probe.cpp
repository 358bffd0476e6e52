// Security probe: what the configuration, the log and the trace writer do in this process.
//   secure_probe LOG_PATH TRACE_PATH [WARNINGS]
// Prints AT_SECURE, what load_config() read from CUDALLOC_LOG_FILE / CUDALLOC_TRACE, then
// asks the log (support/log.cpp) and the trace writer to write to LOG_PATH and TRACE_PATH
// directly. check_security.py runs it setuid-root as an unprivileged user (secure-execution
// mode): no file may appear. Run normally, both files appear (the control). WARNINGS (default
// 1) is how many warnings to log: enough to fill a pipe when LOG_PATH is a FIFO.
#include <sys/auxv.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "config/config.h"
#include "support/log.h"
#include "trace/trace_writer.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) return 2;
  const long warnings = argc == 4 ? std::atol(argv[3]) : 1;
  std::printf("AT_SECURE=%lu\n", ::getauxval(AT_SECURE));
  const auto cr = cudalloc::load_config(cudalloc::process_env());
  std::printf("config_ok=%d log_file='%s' trace='%s'\n", cr.config.has_value() ? 1 : 0,
              cr.config ? cr.config->log_file.c_str() : "", cr.config ? cr.config->trace_path.c_str() : "");
  cudalloc::shim::log_configure(cudalloc::LogLevel::kWarn, argv[1]);
  for (long i = 0; i < warnings; ++i) cudalloc::shim::log_warn("secure_probe: warning %ld", i);
  std::string error;
  auto trace = cudalloc::TraceWriter::open(argv[2], cudalloc::TraceOptions{}, &error);
  std::printf("trace_opened=%d error='%s'\n", trace ? 1 : 0, error.c_str());
  if (trace) trace->finish();
  std::fflush(stdout);
  return 0;
}
