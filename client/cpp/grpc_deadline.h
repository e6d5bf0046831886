// gRPC deadlines relative to now: gRPC adds them to its own clock when the
// call or wait starts, so the client reads no wall clock for them.
#ifndef SLUICE_CLIENT_CPP_GRPC_DEADLINE_H_
#define SLUICE_CLIENT_CPP_GRPC_DEADLINE_H_

#include <grpc/support/time.h>

#include "absl/time/time.h"

namespace sluice::client_internal {

// A deadline `wait` from now, for ClientContext::set_deadline,
// Channel::WaitForConnected and grpc::Alarm::Set.
inline gpr_timespec DeadlineAfter(absl::Duration wait) {
  if (wait == absl::InfiniteDuration()) return gpr_inf_future(GPR_TIMESPAN);
  return gpr_time_from_micros(absl::ToInt64Microseconds(wait), GPR_TIMESPAN);
}

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_GRPC_DEADLINE_H_
