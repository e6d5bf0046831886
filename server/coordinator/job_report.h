// Jobs and leases as the API shows them: a Job with its status, from a
// job's durable state and what the coordinator counts while it runs; a
// Lease as its holder is sent it (unsigned: the service signs it).
#ifndef SLUICE_SERVER_COORDINATOR_JOB_REPORT_H_
#define SLUICE_SERVER_COORDINATOR_JOB_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/epoch_planner.h"
#include "server/coordinator/lease_table.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

// What a job's status reports beside its durable state: soft state the
// coordinator keeps while it runs (none of it journaled). Null = none.
struct JobSoftState {
  std::vector<std::string> live_data_servers;  // of the job's pool
  const v1::LeaseCounts* lease_counts = nullptr;
  const std::map<int32_t, double>* input_wait_by_rank = nullptr;
  const std::map<int32_t, int32_t>* sessions_per_rank = nullptr;
};

// `job` as the API shows it. Without `include_manifest`, the spec is
// copied without its manifests (those of its sources too), which are never
// copied then. A report costs O(ranks), not O(leases + sessions).
v1::Job JobToProto(const JobData& job, bool include_manifest,
                   const JobSoftState& soft);

// The work unit [begin, end) of `job`'s epoch `epoch` numbered `index`
// (a shard, window or mixed block, by the job's kind) and `sequence`.
// `windows` are that epoch's shuffle windows when the job uses them.
void UnitToProto(const JobData& job, int64_t epoch, int32_t index,
                 int64_t begin, int64_t end, int64_t sequence,
                 const std::vector<ShuffleWindow>& windows, v1::WorkUnit* unit);

// `lease` of `job` as its holder is sent it, without a token. `windows`
// are the shuffle windows of the lease's epoch when the job uses them.
v1::Lease LeaseToProto(const LeaseEntry& lease, const JobData& job,
                       const std::vector<ShuffleWindow>& windows);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_JOB_REPORT_H_
