// Minimal line logging to stderr (Abseil 20220623 has no absl/log).
// Each call writes one whole line, so lines from threads never interleave.
#ifndef SLUICE_SERVER_COMMON_LOGGING_H_
#define SLUICE_SERVER_COMMON_LOGGING_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace sluice {

enum class LogSeverity { kInfo, kWarning, kError };

// Writes "<time> <I|W|E> <program>: <message>\n" to stderr.
void LogLine(LogSeverity severity, absl::string_view message);

// Sets the program name shown in each line (default "sluice").
void SetLogProgramName(absl::string_view name);

template <typename... Args>
void LogInfo(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogSeverity::kInfo, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogWarning(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogSeverity::kWarning, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogSeverity::kError, absl::StrFormat(format, args...));
}

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_LOGGING_H_
