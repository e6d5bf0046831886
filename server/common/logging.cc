#include "server/common/logging.h"

#include <cstdio>

#include "absl/base/const_init.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sluice {
namespace {

ABSL_CONST_INIT absl::Mutex program_mu(absl::kConstInit);
std::string* program_name ABSL_GUARDED_BY(program_mu) = nullptr;

}  // namespace

void SetLogProgramName(absl::string_view name) {
  absl::MutexLock lock(&program_mu);
  delete program_name;
  program_name = new std::string(name);
}

void LogLine(LogSeverity severity, absl::string_view message) {
  const char tag = severity == LogSeverity::kInfo      ? 'I'
                   : severity == LogSeverity::kWarning ? 'W'
                                                       : 'E';
  std::string program;
  {
    absl::MutexLock lock(&program_mu);
    program = program_name != nullptr ? *program_name : "sluice";
  }
  const std::string line =
      absl::StrFormat("%s %c %s: %s\n",
                      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                       absl::UTCTimeZone()),
                      tag, program, message);
  // One fwrite per line: stdio locks the stream, so lines stay whole.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace sluice
