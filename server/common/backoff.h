// Exponential backoff with jitter, shared by everything that retries: the
// C++ Reader's coordinator session, the data server's registration stream
// and its shard downloads. The step starts at `initial` and doubles after
// every wait up to `max`; each wait is uniform in [step/2, step] ("equal
// jitter"), so clients that failed together do not retry together.
//
// Not thread-safe: one per retry loop.
#ifndef SLUICE_SERVER_COMMON_BACKOFF_H_
#define SLUICE_SERVER_COMMON_BACKOFF_H_

#include <algorithm>
#include <cstdint>
#include <random>

#include "absl/time/time.h"

namespace sluice {

class Backoff {
 public:
  // `seed` fixes the jitter (tests); the default draws one per instance.
  Backoff(absl::Duration initial, absl::Duration max,
          uint64_t seed = std::random_device{}())
      : initial_(initial),
        max_(std::max(initial, max)),
        step_(initial),
        rng_(seed) {}

  // The wait before the next attempt; the step then doubles (up to max).
  absl::Duration NextWait() {
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    const absl::Duration wait = step_ * jitter(rng_);
    Grow();
    return wait;
  }
  // Doubles the step (up to max) without waiting.
  void Grow() { step_ = std::min(step_ * 2, max_); }
  // After a success: the next failure waits about `initial` again.
  void Reset() { step_ = initial_; }
  // A new ceiling (at least `initial`); the step is capped to it at once.
  void set_max(absl::Duration max) {
    max_ = std::max(initial_, max);
    step_ = std::min(step_, max_);
  }
  absl::Duration step() const { return step_; }

  // The n-th (1-based) step of an unjittered sequence from `initial`
  // doubling up to `max`: initial, 2 initial, 4 initial, ... max.
  static absl::Duration Nth(absl::Duration initial, absl::Duration max, int n) {
    const int doublings = std::clamp(n - 1, 0, 30);
    return std::min(max, initial * (int64_t{1} << doublings));
  }

 private:
  const absl::Duration initial_;
  absl::Duration max_;
  absl::Duration step_;
  std::mt19937_64 rng_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_BACKOFF_H_
