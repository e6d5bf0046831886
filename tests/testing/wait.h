// Polling with a deadline, for tests that wait on a real process: a log line,
// a metric, a file, a counter another thread advances. Polling is not
// synchronisation: the condition decides, the interval only bounds how late
// the test notices it.
#ifndef SLUICE_TESTS_TESTING_WAIT_H_
#define SLUICE_TESTS_TESTING_WAIT_H_

#include <functional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/process.h"

namespace sluice::testing {

// True as soon as `condition` holds; false when it still does not at
// `timeout` (it is asked once more at the deadline).
inline bool WaitUntil(const std::function<bool()>& condition,
                      absl::Duration timeout,
                      absl::Duration interval = absl::Milliseconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(interval);
  }
  return condition();
}

// True once the file at `path` (a server's log, a command's output) contains
// `text`.
inline bool WaitForFileText(const std::string& path, const std::string& text,
                            absl::Duration timeout) {
  return WaitUntil(
      [&] {
        return ReadWholeFile(path).value_or("").find(text) != std::string::npos;
      },
      timeout);
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_WAIT_H_
