// Small synchronous coordinator calls for tests and benchmarks, over
// plaintext gRPC to a coordinator started with ServerProcess.
#ifndef SLUICE_TESTS_TESTING_COORDINATOR_CLIENT_H_
#define SLUICE_TESTS_TESTING_COORDINATOR_CLIENT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice::testing {

// CreateJob(spec); the status is the coordinator's.
absl::Status CreateJob(const std::string& address, const v1::JobSpec& spec);

// GetJob(name), without the manifest.
absl::StatusOr<v1::Job> GetJob(const std::string& address,
                               const std::string& name);

// Opens a Session on `job` as `trainer_id` (rank 0), asks for one lease and
// returns the first Grant's lease, then closes the session (the lease stays
// until its TTL).
absl::StatusOr<v1::Lease> FirstGrant(const std::string& address,
                                     const std::string& job,
                                     const std::string& trainer_id);

// Waits, over the gRPC health Watch stream, until the server at `address`
// reports its "readiness" service SERVING (`serving`) or not; DEADLINE_EXCEEDED
// after `timeout`.
absl::Status WaitForReadiness(const std::string& address, bool serving,
                              absl::Duration timeout);

// The leader named by a standby coordinator's UNAVAILABLE (its NotLeader
// details); NOT_FOUND when `status` carries none.
absl::StatusOr<std::string> NotLeaderHint(const absl::Status& status);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_COORDINATOR_CLIENT_H_
