// The consumer's waits for samples, as a histogram in the protocol's
// InputWait buckets, drained into each heartbeat.
//
// Not thread-safe: the Reader guards it with its state mutex.
#ifndef SLUICE_CLIENT_CPP_INPUT_WAIT_H_
#define SLUICE_CLIENT_CPP_INPUT_WAIT_H_

#include <array>
#include <cstdint>

#include "sluice/v1/coordinator.pb.h"

namespace sluice::client_internal {

class InputWaitHistogram {
 public:
  // Bucket upper bounds in seconds; a last bucket holds the rest (+Inf).
  static constexpr std::array<double, 9> kBounds = {
      0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10};

  // One sample handed out after `seconds` of waiting (0: it was buffered).
  void Observe(double seconds);
  // Moves the waits observed since the last call into `out`; false (and
  // `out` cleared) when there were none.
  bool Take(v1::InputWait* out);

 private:
  std::array<uint64_t, kBounds.size() + 1> counts_ = {};
  double sum_ = 0;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_INPUT_WAIT_H_
