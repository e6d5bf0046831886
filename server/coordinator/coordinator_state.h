// CoordinatorState: the coordinator's durable state, changed only by
// Apply(JournalRecord). Pure: no I/O, no clock, no randomness, so replaying
// the journal rebuilds exactly the state the live server had.
//
// Per job it keeps the spec, the current epoch and its plan, which sample
// ranges of the epoch have been acknowledged (per unit sequence), samples
// consumed per rank, and the live leases (durable part: holder, range,
// fence, acknowledged prefix). Queues of unassigned work are derived from it
// (PendingPieces).
//
// Not thread-safe: owned by CoordinatorService under its mutex.
#ifndef SLUICE_SERVER_COORDINATOR_COORDINATOR_STATE_H_
#define SLUICE_SERVER_COORDINATOR_COORDINATOR_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/coordinator/epoch_planner.h"
#include "server/coordinator/mix_plan.h"
#include "sluice/v1/coordinator.pb.h"
#include "sluice/v1/journal.pb.h"

namespace sluice {

// A sorted set of disjoint half-open intervals.
class IntervalSet {
 public:
  void Add(int64_t begin, int64_t end);
  // Parts of [begin, end) not in the set, in order.
  std::vector<std::pair<int64_t, int64_t>> Missing(int64_t begin,
                                                   int64_t end) const;
  int64_t Covered() const;
  const std::map<int64_t, int64_t>& ranges() const { return ranges_; }

 private:
  std::map<int64_t, int64_t> ranges_;  // begin -> end
};

struct DurableLease {
  std::string lease_id;
  uint64_t fence = 0;
  int32_t rank = 0;
  int32_t worker = 0;  // the reader within the rank (its slot of the quota)
  int64_t sequence = 0;
  int32_t shard_index = 0;
  int64_t begin = 0;
  int64_t end = 0;
  std::string holder;
  int64_t acked = 0;  // acknowledged prefix, samples
};

// Samples [begin, end) of planned unit `sequence`, acknowledged by a rank.
struct AckedRange {
  int64_t sequence = 0;
  int32_t shard_index = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// What each slot (a rank's reader: rank * workers_per_rank + worker)
// acknowledged in one epoch, in acknowledgement order (adjacent ranges of one
// unit merged). A resume cursor keeps a prefix of each (G7).
using AckLog = std::vector<std::vector<AckedRange>>;  // [slot]

// A finished epoch kept so a cursor taken in it can still be restored.
struct EpochHistory {
  EpochPlan plan;
  AckLog ack_log;
  bool replanned = false;
  std::vector<SampleRange> replan_sequence;
  AckLog rolled_back;  // see JobData::rolled_back
};

// A range of unassigned samples of one planned unit.
struct Piece {
  int64_t sequence = 0;
  int32_t shard_index = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int32_t rank = 0;  // planned rank (static mode)
  int32_t slot = 0;  // planned slot (static mode)
  // The remainder of a lease that expired: the slot that held it, whose
  // reader may have delivered some of it unreported, and skips those when
  // it is granted the rest again (client/cpp/lost_deliveries.h). Granted
  // only to that slot while a session of it is open; -1 = to anyone.
  int32_t returned_to = -1;
  int64_t size() const { return end - begin; }
};

// What an epoch's plan is computed from: a job's shape (shared, never
// changed once the job is created), the options and the epoch. Copied out
// under the service's lock, planned without it.
struct PlanInputs {
  std::shared_ptr<const std::vector<int64_t>> shard_samples;
  std::shared_ptr<const MixPlan> mix;  // jobs with sources
  PlanOptions options;
  int64_t epoch = 0;

  // PlanEpoch over the manifest, or PlanSequence over the mixed sequence's
  // blocks.
  EpochPlan Plan() const;
};

// An epoch's plan computed ahead of the journal record that installs it.
struct PreparedPlan {
  PlanOptions options;
  int64_t epoch = 0;
  EpochPlan plan;
  // Chosen by whoever prepared it (> 0): the job's plan_serial once taken.
  uint64_t serial = 0;
  // The PlanInputs' shard counts and mix it was planned from: a job
  // re-created under the same name has others, and refuses the plan.
  std::shared_ptr<const std::vector<int64_t>> shard_samples;
  std::shared_ptr<const MixPlan> mix;
};

struct JobData {
  v1::JobSpec spec;  // defaults filled, manifest inline
  // Per shard of the manifest, its sample count (never null).
  std::shared_ptr<const std::vector<int64_t>> shard_samples;
  // The set of the manifest's shard URLs, hashed (in any order; this
  // process's hash, not journaled); 0 for a job with sources.
  uint64_t shards_fingerprint = 0;
  PlanOptions options;
  // Jobs with sources: their epochs (shard_samples is then empty).
  std::shared_ptr<const MixPlan> mix;
  int64_t create_time_unix_ms = 0;
  int64_t epoch = 0;
  bool done = false;
  EpochPlan plan;  // of `epoch`
  // The serial of the PreparedPlan `plan` was taken from; 0 when it was
  // planned here (not journaled).
  uint64_t plan_serial = 0;
  std::map<int64_t, IntervalSet> acked;    // sequence -> acknowledged ranges
  std::vector<int64_t> consumed_per_slot;  // [rank * workers_per_rank + worker]
  int64_t consumed_total = 0;
  // Jobs with sources: consumed samples of `epoch` per source.
  std::vector<int64_t> consumed_per_source;
  // The same over all epochs acknowledged while this state ran (for the
  // metrics; not journaled).
  std::vector<int64_t> consumed_per_source_total;
  uint64_t next_fence = 1;
  std::map<std::string, DurableLease> leases;
  // Per reader (rank, worker): the samples of its live leases not yet
  // acknowledged, kept with `leases` (a grant checks a reader's quota
  // without walking every lease of the job).
  std::map<std::pair<int32_t, int32_t>, int64_t> outstanding;
  // Live leases per rank, kept with `leases` (a job report does not walk
  // them).
  std::map<int32_t, int32_t> live_leases_by_rank;
  AckLog ack_log;  // of `epoch`
  // Of `epoch`, per slot: what resumes cut off the ack log (acknowledged
  // after the cursor they restored: read by a run whose model was rolled
  // back), in order. Empty unless a resume kept the epoch's plan.
  AckLog rolled_back;
  std::vector<EpochHistory> history;  // the epoch before `epoch`, if kept
  // The plan of `epoch` came from a resume with re-balancing, not PlanEpoch:
  // PlanSequence(replan_sequence).
  bool replanned = false;
  std::vector<SampleRange> replan_sequence;
  // The last cursor applied (a Hello repeating it is a no-op).
  std::optional<v1::internal::JobResumed> last_resume;

  // What epoch `epoch` with `opts` is planned from.
  PlanInputs InputsFor(const PlanOptions& opts, int64_t epoch) const {
    return PlanInputs{shard_samples, mix, opts, epoch};
  }
  // Epoch `epoch` planned with `options`.
  EpochPlan PlanOf(const PlanOptions& opts, int64_t epoch) const {
    return InputsFor(opts, epoch).Plan();
  }
  int64_t served_per_epoch() const {
    return plan.samples_per_rank * plan.num_ranks;
  }
  int64_t consumed_by_rank(int32_t rank) const {
    int64_t n = 0;
    for (int32_t w = 0; w < plan.workers_per_rank; ++w) {
      n += consumed_per_slot[plan.SlotOf(rank, w)];
    }
    return n;
  }
  bool epoch_complete() const { return consumed_total >= served_per_epoch(); }
  int64_t outstanding_of(int32_t rank, int32_t worker) const {
    auto it = outstanding.find({rank, worker});
    return it == outstanding.end() ? 0 : it->second;
  }
  // Adds (sign 1) or removes (-1) a lease: its unacknowledged samples and
  // its rank's count of live leases.
  void CountOutstanding(const DurableLease& l, int64_t sign) {
    int64_t& n = outstanding[{l.rank, l.worker}];
    n += sign * ((l.end - l.begin) - l.acked);
    if (n == 0) outstanding.erase({l.rank, l.worker});
    int32_t& live = live_leases_by_rank[l.rank];
    live += static_cast<int32_t>(sign);
    if (live == 0) live_leases_by_rank.erase(l.rank);
  }
};

class CoordinatorState {
 public:
  absl::Status Apply(const v1::internal::JournalRecord& record);
  // The same, moving large parts (a new job's manifest) out of `record`.
  absl::Status Apply(v1::internal::JournalRecord&& record);

  const JobData* FindJob(const std::string& name) const;
  const std::map<std::string, JobData>& jobs() const { return jobs_; }

  // Unassigned work of `job`'s current epoch: every planned unit minus the
  // acknowledged ranges and the ranges of live leases, in plan order.
  std::vector<Piece> PendingPieces(const JobData& job) const;
  // Whether `resume` (a JobResumed record) can be applied: the cursor's job
  // exists, its epoch is the current or the previous one of that job, its
  // counts fit what each rank acknowledged, and a cursor from another job
  // has the same manifest, seed and shuffle, and its readers per rank are
  // those the epoch was read with. INVALID_ARGUMENT or FAILED_PRECONDITION
  // naming the field otherwise.
  absl::Status CheckResume(const v1::internal::JobResumed& resume) const;
  // Offers `plan` (`job`'s, computed from its InputsFor) for the record that
  // next plans that job's epoch `plan.epoch` with `plan.options`: an epoch
  // advance, or the readers per rank set. Taken instead of planning again
  // (the same plan: planning is a pure function of its inputs); dropped
  // when the job is removed or re-created, or once the job plans a later
  // epoch. Ignored for a job that does not exist or is past that epoch, or
  // that is not the job it was planned for (a plan computed while the job
  // was deleted and created again: other shards). A job keeps its
  // kMaxOfferedPlans latest offers.
  void OfferPlan(const std::string& job, PreparedPlan plan);
  static constexpr size_t kMaxOfferedPlans = 4;
  // Whether a plan for `job`'s epoch `epoch` with `options` is on offer.
  bool HasOfferedPlan(const std::string& job, const PlanOptions& options,
                      int64_t epoch) const;
  // Whether the plan with that serial is on offer for `job`.
  bool HasOfferedSerial(const std::string& job, uint64_t serial) const;
  // Plans installed from an offer, and planned by Apply itself.
  int64_t plans_offered_taken() const { return plans_offered_taken_; }
  int64_t plans_computed() const { return plans_computed_; }
  // The whole state as one record; Apply(snapshot) on any state rebuilds it.
  v1::internal::JournalRecord Snapshot() const;
  // The finished Once steps of `scope` ("" = all).
  std::vector<v1::internal::OnceFinished> OnceFinishedIn(
      const std::string& scope) const;
  // A finished Once step ("scope/name"), if journaled.
  const v1::internal::OnceFinished* FindOnceFinished(
      const std::string& scope, const std::string& name) const;

 private:
  void StartEpoch(JobData& job, int64_t epoch);
  // The plan of `job`'s epoch `epoch` with `options`: the offered one if it
  // matches, planned here otherwise.
  // Sets the job's plan_serial.
  EpochPlan TakePlan(JobData& job, const PlanOptions& options, int64_t epoch);
  void AddJob(JobData job, int64_t create_time_unix_ms);
  absl::Status ApplyResume(const v1::internal::JobResumed& resume);
  absl::Status ApplyWorkersSet(const v1::internal::WorkersSet& set);
  absl::Status ApplySnapshot(const v1::internal::Snapshot& snapshot);
  std::map<std::string, JobData> jobs_;
  std::map<std::string, std::vector<PreparedPlan>> offered_plans_;  // by job
  int64_t plans_offered_taken_ = 0;
  int64_t plans_computed_ = 0;
  // By (scope, name): "a/b" + "c" and "a" + "b/c" are different steps.
  std::map<std::pair<std::string, std::string>, v1::internal::OnceFinished>
      once_finished_;
  // Fences are unique across the coordinator, not only within a job: a job
  // created starts above every fence granted before, so a job deleted and
  // created again under its name (a rerun) never presents a data server a
  // fence older than one it has seen for the same unit.
  uint64_t next_fence_floor_ = 1;
};

// Fills defaults into a validated spec's copy and converts options.
PlanOptions PlanOptionsFromSpec(const v1::JobSpec& spec);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_COORDINATOR_STATE_H_
