// An injectable clock. Lease, heartbeat and timeout logic takes a Clock* so
// unit tests can drive time with FakeClock (tests/testing/fake_clock.h) and
// never sleep.
#ifndef SLUICE_SERVER_COMMON_CLOCK_H_
#define SLUICE_SERVER_COMMON_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sluice {

// Thread-safe: implementations may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide real clock.
  static Clock* Real();
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

inline Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();
  return clock;
}

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_CLOCK_H_
