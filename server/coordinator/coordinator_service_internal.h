// Limits and helpers the coordinator's logic shares: CoordinatorService
// (coordinator_service.cc) and the Granter.
// Not for use outside the coordinator.
#ifndef SLUICE_SERVER_COORDINATOR_COORDINATOR_SERVICE_INTERNAL_H_
#define SLUICE_SERVER_COORDINATOR_COORDINATOR_SERVICE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/epoch_planner.h"
#include "server/coordinator/lease_table.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice::coordinator_internal {

// What a reader of a finished job is told.
inline std::string JobDoneMessage(const JobData& job) {
  return absl::StrCat(
      "job \"", job.spec.name(), "\" is done: all ", job.spec.num_epochs(),
      " epochs were consumed; create a new job or resume from a cursor");
}

// Ids a trainer names (trainer_id, lease_id): longer ones are refused
// without being quoted.
constexpr size_t kMaxIdBytes = 256;

// The fence space: a data server may claim to have seen fences up to
// kMaxFenceSeen (more is refused), and no grant takes a fence at or above
// kFenceLimit, so fences never wrap or repeat (2^62 grants is far beyond any
// coordinator's life: a million grants a second for 146,000 years).
constexpr uint64_t kMaxFenceSeen = uint64_t{1} << 62;
constexpr uint64_t kFenceLimit = uint64_t{1} << 63;

// A data server's routing weight (a larger one would take every grant).
constexpr int32_t kMaxDataServerCapacity = 1024;

// Readers per rank a Hello may name (DataLoader workers).
constexpr int32_t kMaxWorkersPerRank = 1024;
// Slots (rank x worker) per job: each holds counts and an acknowledgement log.
constexpr int64_t kMaxReadersPerJob = 1 << 20;

inline absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

inline v1::CoordinatorMessage Rejected(const std::string& lease_id,
                                       const absl::Status& s) {
  v1::CoordinatorMessage m;
  m.mutable_rejected()->set_lease_id(lease_id);
  m.mutable_rejected()->set_code(s.raw_code());
  m.mutable_rejected()->set_message(std::string(s.message()));
  return m;
}

// The live-table form of a lease from its durable record.
inline LeaseEntry LiveLease(const DurableLease& d, const JobData& job) {
  LeaseEntry lease;
  lease.lease_id = d.lease_id;
  lease.fence = d.fence;
  lease.job = job.spec.name();
  lease.epoch = job.epoch;
  if (job.mix == nullptr && !UsesWindows(job.options) &&
      d.shard_index < job.spec.manifest().shards_size()) {
    lease.shard_url = job.spec.manifest().shards(d.shard_index).url();
  }
  lease.rank = d.rank;
  lease.worker = d.worker;
  lease.shard_index = d.shard_index;
  lease.begin = d.begin;
  lease.end = d.end;
  lease.sequence = d.sequence;
  lease.holder = d.holder;
  lease.consumed = d.acked;
  return lease;
}

}  // namespace sluice::coordinator_internal

#endif  // SLUICE_SERVER_COORDINATOR_COORDINATOR_SERVICE_INTERNAL_H_
