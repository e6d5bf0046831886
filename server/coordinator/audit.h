// Audit: which samples one reader of a job took in an epoch, named by
// shard, index and source, in the order it took them.
//
// The answer comes from the epoch's ack log (CoordinatorState's AckLog: per
// slot, every range the reader acknowledged, in acknowledgement order),
// which the journal and its snapshots keep for a job's current epoch and
// the one before it. Readers deliver units one after another and report
// what they delivered, so that order is the order the trainer's loop got
// the samples; a resume keeps the prefix its cursor counted, and what the
// resumed reader takes next follows it.
//
// Two steps, so that the service's lock is held for the cheap one only:
// SliceAudit copies out, under the lock, the units the asked positions fall
// in (at most `count` samples' worth); NameAuditedSamples then orders them
// (shuffle-window labels, mixed orders, as a data server serves them)
// without it.
#ifndef SLUICE_SERVER_COORDINATOR_AUDIT_H_
#define SLUICE_SERVER_COORDINATOR_AUDIT_H_

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/epoch_planner.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

// How long a replay lease (AuditedSample.replay_lease) is valid.
inline constexpr absl::Duration kReplayLeaseTtl = absl::Minutes(5);

// Samples an AuditRequest returns by default, and at most.
inline constexpr int64_t kAuditDefaultCount = 1000;
inline constexpr int64_t kAuditMaxCount = 10000;

// The asked part of a reader's log: the answer's header (job, epoch, rank,
// worker, total, workers_per_rank, epochs_kept) and, per acknowledged range
// the asked positions meet, that range's unit cut to them.
struct AuditSlice {
  v1::AuditResponse header;
  // Asked for replay leases: what each sample's lease copies (job, epoch,
  // rank, on_corrupt, weight, tenant; augment_seed the job's seed).
  bool replay = false;
  v1::Lease lease_template;
  struct Part {
    int64_t position = 0;  // of the unit's first sample in the reader's order
    v1::WorkUnit unit;
    // Positions of the unit that a resume rolled back (any reader's).
    std::vector<std::pair<int64_t, int64_t>> reread;
  };
  std::vector<Part> parts;
};

// The epochs of `job` an audit can name, oldest first: the current one
// (unless the job is done) and the one before it, if kept.
std::vector<int64_t> AuditableEpochs(const JobData& job);

// Checks `request` against `job` (INVALID_ARGUMENT naming the field, or
// FAILED_PRECONDITION naming the epochs kept) and copies out its slice.
// `current_windows` are the shuffle windows of the job's current epoch
// when it uses them (those of the epoch before are planned here).
absl::StatusOr<AuditSlice> SliceAudit(
    const JobData& job, const v1::AuditRequest& request,
    const std::vector<ShuffleWindow>& current_windows);

// Signs a replay lease (sets its expiry and token).
using SignReplayLease = std::function<void(v1::Lease*)>;

// The slice's samples, named and in order, after its header; with
// replay leases when the slice asks for them, each signed by `sign`.
absl::StatusOr<v1::AuditResponse> NameAuditedSamples(
    AuditSlice slice, const SignReplayLease& sign);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_AUDIT_H_
