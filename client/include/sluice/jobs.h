// What a trainer asks about a job before it reads: the job's figures (the
// samples each rank gets per epoch, what a dataset's len() reports), and
// the job a run with another number of ranks than the job was made for
// reads.
//
//   sluice::JobQuery q{.coordinator = "head:7070"};
//   absl::StatusOr<std::string> job = sluice::JobForWorldSize(q, "cifar", 12);
//   absl::StatusOr<sluice::v1::Job> figures = sluice::DescribeJob(q, *job);
//   int64_t per_rank = figures->status().samples_per_rank();
//
// Both are blocking calls, safe from any thread.
#ifndef SLUICE_CLIENT_INCLUDE_SLUICE_JOBS_H_
#define SLUICE_CLIENT_INCLUDE_SLUICE_JOBS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/tls.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

struct JobQuery {
  // "HOST:PORT", or several comma-separated (the ready one answers).
  std::string coordinator;
  // TLS (PEM text); none = plaintext.
  std::optional<ClientTls> tls;
  // Each call's deadline. A call waits for a coordinator that is starting
  // or failing over, as a Reader does.
  absl::Duration timeout = absl::Seconds(120);
};

// The job `job` as the coordinator describes it (spec and status).
// NOT_FOUND for an unknown job; UNAVAILABLE names a TLS mismatch.
absl::StatusOr<v1::Job> DescribeJob(const JobQuery& query,
                                    const std::string& job);

// The job a run of `world_size` ranks reads: `job` itself when its spec's
// world_size is 0 (any) or `world_size`; else the copy
// "<job>.w<world_size>", created when missing (the same data in the same
// order; a cursor of either job resumes the other). Errors name the job
// and the run's world size.
absl::StatusOr<std::string> JobForWorldSize(const JobQuery& query,
                                            const std::string& job,
                                            int world_size);

}  // namespace sluice

#endif  // SLUICE_CLIENT_INCLUDE_SLUICE_JOBS_H_
