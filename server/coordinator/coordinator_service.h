// CoordinatorService: jobs, trainer sessions and shard leases (logic only;
// grpc_coordinator_service.cc adapts it to gRPC).
//
// Every state change goes: validate -> CoordinatorState::Apply -> journal
// Enqueue, both under mu_ (journal order is apply order, and a record the
// state refuses is never journaled) -> release mu_ -> WaitDurable (group
// commit) -> deliver the messages that depend on it (durable_outbox.h). No
// trainer ever hears of state that a crash could lose (G5).
//
// Worked example (world_size 2, static): CreateJob; session A Hello{rank 0},
// Want{2} -> Welcome, EpochBegin{0, q}, Grant x2 of rank 0's first units;
// Progress/Complete journal UnitAcked; when every rank has consumed its q
// samples the epoch advances: EpochEnd{0}, EpochBegin{1} to every session.
// A session whose stream breaks keeps its leases until their TTL; a Hello
// with the same trainer_id within it takes them over (Grants are re-sent).
//
// Thread-safety: all public methods may be called from any thread.
#ifndef SLUICE_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define SLUICE_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/common/clock.h"
#include "server/common/path_roots.h"
#include "server/common/thread_pool.h"
#include "server/coordinator/coordinator_metrics.h"
#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/data_server_admission.h"
#include "server/coordinator/data_server_registry.h"
#include "server/coordinator/durable_outbox.h"
#include "server/coordinator/fleet_sizer.h"
#include "server/coordinator/granter.h"
#include "server/coordinator/job_spec.h"
#include "server/coordinator/journal.h"
#include "server/coordinator/lease_table.h"
#include "server/coordinator/once_barrier.h"
#include "server/coordinator/plan_ahead.h"
#include "server/coordinator/recovered_journal.h"
#include "server/coordinator/session_table.h"
#include "server/coordinator/unreachable_servers.h"
#include "server/coordinator/work_queues.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

struct CoordinatorOptions {
  Clock* clock = Clock::Real();
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration default_lease_ttl = absl::Seconds(10);
  // Upcoming units looked at after each grant for data servers' prefetch
  // hints; 0 = no hints.
  int prefetch_hint_units = 8;
  // Grants of dynamic jobs prefer units of shards other jobs read at the
  // same time (Granter), so that data servers decode their images once
  // for all of them.
  bool steer_shared_shards = true;
  // How the data servers the jobs need is estimated (fleet_sizer.h),
  // every `fleet_interval`.
  FleetSizerOptions fleet;
  absl::Duration fleet_interval = absl::Seconds(5);
  // Compact the journal into one snapshot once it is larger than this and
  // than twice the last snapshot. 0 = never.
  int64_t journal_compact_bytes = 64 << 20;
  CoordinatorMetrics* metrics = nullptr;  // optional
  // Grants wait (Waiting{reason} on the stream) while no data server is
  // live, instead of naming none. Off only for tests of the lease logic
  // with scripted trainers that read nothing.
  bool wait_for_data_servers = true;
  // Secret for lease tokens (HMAC-SHA256, see server/common/lease_token.h),
  // shared with the data servers. Empty = leases carry no token.
  std::string lease_secret;
  // Directories JobSpec.manifest_path may name files in (resolved as the
  // data servers resolve shard paths: "..", symlinks). Empty = manifest_path
  // is refused (manifests are sent inline).
  std::vector<std::string> manifest_roots;
  // Largest manifest file read for manifest_path.
  int64_t max_manifest_bytes = 256 << 20;
  // Open sessions per job (each holds a stream, its queue and its leases);
  // a Hello beyond it is RESOURCE_EXHAUSTED.
  int64_t max_sessions_per_job = 65536;
  // Per tenant (JobSpec.tenant): jobs that exist, and open sessions over
  // all its jobs. A CreateJob or Hello beyond it is RESOURCE_EXHAUSTED
  // naming the tenant and the limit. 0 = no limit.
  int64_t max_jobs_per_tenant = 0;
  int64_t max_sessions_per_tenant = 0;
  JobLimits job_limits;
  // Participants one Barrier may name.
  int32_t max_barrier_participants = 100000;
  // The expiry thread's own stall detection (ExpiryTick): a tick that comes
  // more than `stall_bound` after the previous one by `stall_clock` means
  // the process was not running (SIGSTOP, a VM or swap stall), and every
  // live lease and data server gets a fresh TTL before anything expires.
  // The thread ticks at least every 100 ms, so a bound of 500 ms is never
  // reached by a running coordinator.
  Clock* stall_clock = Clock::Real();
  absl::Duration stall_bound = absl::Milliseconds(500);
};

// How long a client may take to leave a coordinator that stopped answering
// and reach the next one: its keepalive (a PING every 2 s, failed after 2 s
// unanswered; grpc_target.h) plus a reconnect backoff of at most 1 s.
inline constexpr absl::Duration kReconnectGrace = absl::Seconds(5);

// The heartbeats per second one job's readers are asked to stay under
// (all of them at once; a job of 8,192 readers heartbeats every 4.1 s).
inline constexpr double kHeartbeatsPerSecondPerJob = 2000;
// The longest heartbeat interval a reader is asked for, as a share of its
// lease TTL: a lease survives two lost heartbeats. A job that sets no
// lease_ttl_ms and has more readers than kHeartbeatsPerSecondPerJob x
// kHeartbeatShareOfTtl x --default_lease_ttl (8,000 with the defaults) gets a
// TTL long enough to stay within the budget: readers / 800 s (20.5 s for
// 16,384 readers), which is then how long a dead reader's leases take to
// return.
inline constexpr double kHeartbeatShareOfTtl = 0.4;

class CoordinatorService {
 public:
  // A service over `recovered` (the journal and the state it replayed to,
  // open_journal.h; no journal = one in memory): every recovered lease gets
  // a fresh TTL.
  static absl::StatusOr<std::unique_ptr<CoordinatorService>> Create(
      const CoordinatorOptions& options, RecoveredJournal recovered = {});
  ~CoordinatorService();

  // The calls that answer one caller (operators, tools) answer through
  // `done`, called exactly once: at once when refused, else when the
  // journal records the answer depends on (or reports) are durable, from
  // the thread that finds them durable. No lock is held and the caller's
  // thread never waits for the disk. Each also has a form that blocks until
  // the answer (tests, tools).
  using JobReply = std::function<void(absl::StatusOr<v1::Job>)>;
  using JobsReply = std::function<void(absl::StatusOr<std::vector<v1::Job>>)>;
  using AuditReply = std::function<void(absl::StatusOr<v1::AuditResponse>)>;
  using StatusReply = std::function<void(absl::Status)>;
  using NamesReply =
      std::function<void(absl::StatusOr<std::vector<std::string>>)>;

  // Creates a job (NormalizeJobSpec's errors; ALREADY_EXISTS for a name
  // taken by another spec; the same spec again is answered with the job).
  void CreateJob(const v1::JobSpec& spec, JobReply done);
  absl::StatusOr<v1::Job> CreateJob(const v1::JobSpec& spec);
  // Creates `name` as job `source`'s stored spec with `world_size`: the same
  // data in the same order over another number of ranks (CreateJob's
  // idempotence and errors; NOT_FOUND naming `source`).
  void CopyJob(const std::string& source, const std::string& name,
               int32_t world_size, JobReply done);
  absl::StatusOr<v1::Job> CopyJob(const std::string& source,
                                  const std::string& name, int32_t world_size);
  const CoordinatorOptions& options() const { return options_; }
  // GetJob and ListJobs report state only once it is durable (UNAVAILABLE
  // when the journal failed).
  void GetJob(const std::string& name, bool include_manifest, JobReply done);
  absl::StatusOr<v1::Job> GetJob(const std::string& name,
                                 bool include_manifest);
  void ListJobs(JobsReply done);
  absl::StatusOr<std::vector<v1::Job>> ListJobs();
  // Deletes the job and its copies for other world sizes (CopyJobName:
  // "<name>.w<N>", made for elastic runs), each with its leases and
  // sessions. Answers with the jobs deleted: the copies, then the job.
  void DeleteJob(const std::string& name, NamesReply done);
  absl::StatusOr<std::vector<std::string>> DeleteJob(const std::string& name);
  // The samples one reader acknowledged in an epoch (audit.h), once the
  // acknowledgements it names are durable. NOT_FOUND naming the job.
  void Audit(const v1::AuditRequest& request, AuditReply done);
  absl::StatusOr<v1::AuditResponse> Audit(const v1::AuditRequest& request);

  // A new Session stream. Returns its id for OnMessage/CloseSession.
  int64_t OpenSession(std::shared_ptr<SessionSink> sink);
  // Handles one trainer message. Protocol errors end the stream through the
  // sink; per-lease errors (stale fence ...) are answered with Rejected.
  void OnMessage(int64_t session_id, const v1::TrainerMessage& message);
  // The stream ended (either side). Leases stay until their TTL.
  void CloseSession(int64_t session_id);

  // Reclaims expired leases; returns how many. Called by tests with a fake
  // clock (the expiry thread calls ExpiryTick).
  int ExpireLeases();
  // One tick of the expiry thread: if more than options.stall_bound passed
  // by options.stall_clock between the end of the previous tick and the
  // start of this one (before it waits for the service's lock: a busy
  // coordinator is not a stalled one), the coordinator was stalled, and
  // every live lease and data server gets a fresh TTL first (as after a
  // restart: their holders' heartbeats could not be read); then
  // ExpireLeases and the Once/Barrier deadlines. Returns the leases
  // expired.
  int ExpiryTick();
  // Starts the thread that reclaims expired leases and ends Once runs and
  // Barrier waits past their deadlines (ExpireLeases, OnceBarrier::Tick). It
  // wakes at the next lease expiry by the service's clock, and at least
  // every 100 ms of real time (leases granted meanwhile, a test clock that
  // jumps). Drain and the destructor stop it.
  void StartExpiryThread();

  // Once and Barrier, on this service's clock, journaling finished steps
  // through this service (PersistOnceFinished).
  OnceBarrier& once_barrier() { return *once_barrier_; }

  // Data-server registry: soft state, never journaled (servers re-register
  // after a coordinator restart). A server is live while it heartbeats
  // within data_server_timeout(); grants name a live server chosen by
  // rendezvous hashing of the shard URL (weighted by capacity), so a shard
  // keeps going to the same server while the set of servers is stable.
  // `sink` (may be null) first gets the DataServerRegistered reply, then
  // PrefetchHints: after each grant, the remote shards of the next
  // `prefetch_hint_units` units of the grant's queue, each sent to the
  // server those units will be routed to, once per registration.
  // `max_fence_seen`: the newest fence the server was presented; grants
  // from now on use fences above it (a coordinator that lost its journal
  // would otherwise start over at 1 and be refused as stale).
  // OK when `r` may register with this coordinator
  // (data_server_admission.h, with its lease secret).
  absl::Status CheckRegistration(const v1::RegisterDataServer& r) const {
    return CheckDataServerRegistration(r, options_.lease_secret);
  }
  int64_t RegisterDataServer(const std::string& address, int32_t capacity,
                             std::shared_ptr<DataServerSink> sink = nullptr,
                             uint64_t max_fence_seen = 0,
                             const std::string& node = "",
                             const std::string& pool = "");
  // Records a heartbeat without the state lock (session work never delays
  // it); takes the lock only when no data server was live before it, to
  // feed the sessions waiting for one.
  void DataServerHeartbeat(int64_t id, uint64_t max_fence_seen = 0,
                           const DataServerRegistry::Load* load = nullptr);
  // FleetSizer's answer (-1 before its first) and the trainers' wait share
  // it used.
  int32_t desired_data_servers() const { return desired_data_servers_.load(); }
  double input_wait_share() const { return input_wait_share_.load(); }
  // The same per data-server pool (every pool with a job or a registered
  // server), with its live and draining servers.
  std::vector<v1::PoolFleet> PoolFleets();
  // Feeds FleetSizer what happened since its last call (the expiry thread
  // calls it every fleet_interval; tests call it directly).
  void SizeFleet();
  void UnregisterDataServer(int64_t id);
  // The server registered as `id` is leaving (DataServerDraining): no new
  // unit goes to it; the leases it serves stay valid.
  void DataServerDraining(int64_t id);
  std::vector<std::string> LiveDataServers();

  // Once steps: journal a finished step (`done` is called once it is
  // durable, by the outbox, or with the error that refused it), and look one
  // up (survives restarts through the journal).
  void PersistOnceFinished(const v1::internal::OnceFinished& finished,
                           std::function<void(const absl::Status&)> done);
  std::optional<v1::internal::OnceFinished> FindOnceFinished(
      const std::string& scope, const std::string& name);
  // The finished steps of `scope` ("" = all), by scope and name.
  std::vector<v1::internal::OnceFinished> ListOnceFinished(
      const std::string& scope);
  // Forgets a finished step (journaled; answered once durable), so that its
  // next caller runs it again. NOT_FOUND when it has not finished.
  void ResetOnce(const std::string& scope, const std::string& name,
                 StatusReply done);
  absl::Status ResetOnce(const std::string& scope, const std::string& name);
  absl::Duration data_server_timeout() const {
    return 3 * options_.heartbeat_interval;
  }
  // When the next lease expires (for the expiry thread's wait).
  absl::Time NextExpiry();

  // Stops the expiry thread (a successor gives every lease a fresh TTL) and
  // ends every session with UNAVAILABLE so trainers reconnect elsewhere or
  // later.
  void Drain();

  int64_t recovered_records() const { return recovered_records_; }

  // Waits until every message the service has decided to send was handed to
  // its sink (tests; messages wait for the journal records they depend on).
  void Flush();

  // Waits until every epoch plan asked of the planning thread so far is on
  // offer (tests).
  void WaitForPlansAhead();
  // Waits until every journal compaction begun so far has ended (tests);
  // returns how many have ended since start-up, failed or not.
  int64_t WaitForCompactions();

  // Epoch plans installed from a plan made outside the lock, and planned
  // under it (CoordinatorState::plans_offered_taken, plans_computed).
  std::pair<int64_t, int64_t> PlansTakenAndComputed();

 private:
  // Sets sluice_coordinator_data_servers to the live count (the registry
  // has its own lock: callable with or without mu_).
  void UpdateDataServerMetric();

  // Runtime per-job data, not journaled (the grant queues are queues_).
  struct JobRuntime {
    // Seconds each rank's readers' consumers waited for samples (reported
    // in heartbeats; not journaled).
    std::map<int32_t, double> input_wait_by_rank;
    // Lease outcomes since this coordinator began serving (JobStatus.leases).
    v1::LeaseCounts lease_counts;
    // When each slot's last open session went away (a broken stream, a
    // process gone): its expired remainders wait kReconnectGrace from then
    // for it to reconnect (SlotKeepsRemaindersLocked). No reader waits on
    // them meanwhile: a slot's remainders never exceed what is left of its
    // own quota, so the others' quotas fit in the rest of the queue.
    std::map<int32_t, absl::Time> slot_left_at;
    // The epoch and options last asked of the planning thread.
    int64_t ahead_epoch = -1;
    PlanOptions ahead_options;
  };
  // Validates a heartbeat's InputWait and records it: the job's
  // sluice_trainer_input_wait_seconds histogram and the rank's total.
  absl::Status RecordInputWaitLocked(const Session& s, const v1::InputWait& w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  explicit CoordinatorService(const CoordinatorOptions& options);

  // Journals and applies one record (under mu_).
  absl::Status CommitLocked(v1::internal::JournalRecord record, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes one existing job: its leases, record, queues and sessions.
  absl::Status DeleteJobLocked(const std::string& name, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Effects leave in the order they were decided (durable_outbox.h):
  // SubmitLocked queues them under mu_, DeliverReady (after releasing mu_)
  // sends those already durable.
  void SubmitLocked(Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    outbox_->Submit(std::move(fx));
  }
  void DeliverReady() ABSL_LOCKS_EXCLUDED(mu_) { outbox_->DeliverReady(); }
  // When the journal has grown enough: takes a snapshot of state_ and has
  // the compactor write it in place of the journal (Journal::
  // BeginCompaction/FinishCompaction), unless a compaction is under way.
  void MaybeCompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's grant queues from its state (the fresh queues planned ahead
  // when its epoch was installed from that plan and nothing of it is
  // granted or acknowledged yet), then asks the planning thread for the
  // job's next epoch.
  void RebuildQueuesLocked(const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the planning thread for `job`'s epoch after its current one,
  // unless the job is done or that plan is on offer or asked for already.
  void PlanNextEpochAheadLocked(const std::string& name, const JobData& job,
                                JobRuntime& rt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Offers a plan made outside the lock: to the state, and its fresh
  // queues to the job's runtime.
  void OfferPlannedLocked(const std::string& name, PlannedAhead planned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OnMessage; a Hello that sets its job's readers per rank has the epoch
  // planned for them (PlanForHello) before it is handled, when
  // `may_plan_first`.
  void HandleMessage(int64_t session_id, const v1::TrainerMessage& message,
                     bool may_plan_first) ABSL_LOCKS_EXCLUDED(mu_);
  // Before a Hello is handled: when it will set its job's readers per rank
  // (no lease out, nothing consumed), plans the epoch for them outside the
  // lock and offers it, so that handling the Hello installs it. One such
  // plan at a time (hello_plan_mu_): the other readers' Hellos, arriving
  // together, find it on offer.
  void PlanForHello(const v1::Hello& hello) ABSL_LOCKS_EXCLUDED(mu_);
  // What that plan is made from, if the Hello needs one not on offer.
  std::optional<PlanInputs> HelloPlanInputsLocked(const v1::Hello& hello)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Which of a job's sessions a pump visits.
  enum class PumpScope {
    kOne,      // `only`: a message of that session changed only its own state
    kWanting,  // the sessions holding fewer leases than their credits (and
               // `only`, if given): work came back or a data server appeared
    kAll,      // every open session: a new epoch to announce
  };
  // Announces epochs and grants up to each visited session's credits, and
  // keeps the job's set of wanting sessions up to date for them.
  void PumpLocked(const std::string& job, Effects& fx, PumpScope scope,
                  Session* only = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every job's wanting sessions (a data server became live).
  void PumpAllLocked(Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the open session of `holder` (a lease's holder) as wanting: one of
  // its leases ended without a message of its own, so it may take more.
  void NoteHolderWantsLocked(const std::string& holder)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants `s` the Granter's next lease: commits its record, adds it to the
  // lease table, sends it and hints what follows. False, with why the
  // reader waits (when it is told), if there is none.
  bool GrantOneLocked(Session& s, const JobData& job, JobRuntime& rt,
                      Effects& fx, std::string* why_not,
                      v1::WaitingKind* why_kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a lease of `job_name` that ended with all its samples
  // acknowledged (GetJob's lease counts, the completed metric).
  void CountCompletedLocked(const std::string& job_name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a lease ends without completing (LeaseEnded.reason names it).
  // Ends the live lease: journals LeaseEnded, returns its unread remainder
  // to the front of its slot's queue and counts the outcome.
  void EndLeaseLocked(const std::string& job, const std::string& lease_id,
                      v1::internal::LeaseEnd end, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns whether a new epoch began.
  bool MaybeAdvanceEpochLocked(const std::string& job, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleHelloLocked(Session& s, const v1::Hello& hello, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies hello.cursor (G7) unless it repeats the job's last resume.
  // Plans the job's current epoch for hello.num_workers readers per rank
  // when it differs and the epoch is untouched; FAILED_PRECONDITION when it
  // differs in an epoch being read.
  absl::Status UseWorkersLocked(const v1::Hello& hello, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lease tokens carry their expiry: the session's held leases whose token
  // has less than half a TTL left are sent again (same lease and fence, the
  // renewed expiry, a new token).
  void RefreshTokensLocked(Session& s, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ResumeLocked(const v1::Hello& hello, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleLeaseMessageLocked(Session& s, const v1::TrainerMessage& m,
                                        Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishSessionLocked(Session& s, const absl::Status& status, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a session past Hello and not finished reads `slot` of `job`.
  bool SlotHasOpenSessionLocked(const JobData& job, int32_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether an expired remainder returned to `slot` is kept for it: while
  // the slot has an open session, and for kReconnectGrace after its last
  // one went away (a paused reader's stream often breaks on waking, and
  // only that reader knows what it delivered of the lease unreported).
  bool SlotKeepsRemaindersLocked(const JobData& job, const JobRuntime& rt,
                                 int32_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the session from its job's open sessions (finished or closed)
  // and notes when its slot was left without one.
  void ForgetOpenLocked(const Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Slot `slot` of job `job` has no open session left since now.
  void NoteSlotLeftLocked(const std::string& job, int32_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Job JobToProtoLocked(const JobData& job, bool include_manifest)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Lease LeaseToProtoLocked(const LeaseEntry& lease, const JobData& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's lease_ttl_ms, or --default_lease_ttl stretched for a job too
  // big for its heartbeats to fit kHeartbeatsPerSecondPerJob.
  absl::Duration TtlLocked(const JobData& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The heartbeat interval a reader of `job` read with `workers` readers
  // per rank is asked for (Welcome): the --heartbeat_interval, longer for a
  // job whose readers would together send more than
  // kHeartbeatsPerSecondPerJob, and at most kHeartbeatShareOfTtl of its
  // lease TTL (or the --heartbeat_interval, if that is longer).
  absl::Duration HeartbeatIntervalLocked(const JobData& job,
                                         int32_t workers) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The TTL a live lease gets when this coordinator starts leading (a
  // restart, an HA takeover) or notices it was not running: the job's TTL
  // plus kReconnectGrace, the time a holder needs to notice that its
  // coordinator stopped answering and reach this one.
  absl::Duration RecoveryTtlLocked(const JobData& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return TtlLocked(job) + kReconnectGrace;
  }
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateRankSkewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  std::optional<PathRoots>
      manifest_roots_;  // set when options_.manifest_roots is
  std::unique_ptr<Journal> journal_;
  int64_t recovered_records_ = 0;
  int64_t last_snapshot_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // One data-server pool's sizing: FleetSizer's inputs since the last
  // SizeFleet (samples acknowledged and input-wait seconds reported by its
  // jobs' readers) and its answer.
  struct PoolSizing {
    explicit PoolSizing(const FleetSizerOptions& options) : sizer(options) {}
    int64_t consumed = 0;
    double wait_seconds = 0;
    FleetSizer sizer;
    int32_t desired = -1;
    double wait_share = 0;
  };
  PoolSizing& PoolSizingLocked(const std::string& pool)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, PoolSizing> pool_sizing_ ABSL_GUARDED_BY(mu_);
  absl::Time last_sizing_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::atomic<int32_t> desired_data_servers_{-1};
  absl::Time next_sizing_ = absl::InfinitePast();  // the expiry thread's
  std::atomic<double> input_wait_share_{0};

  absl::Mutex mu_;
  // Takes mu_ for a scope, timing the wait for it, how long it is held and
  // the holding thread's CPU time meanwhile
  // (sluice_coordinator_lock_{wait,hold,hold_cpu}_seconds, when metrics are
  // on). A hold that used more than kSlowLockHold of CPU is logged with the
  // function that took the lock (at most 10 such lines a second), as etcd
  // warns of a slow apply.
  static constexpr absl::Duration kSlowLockHold = absl::Milliseconds(1);
  class ABSL_SCOPED_LOCKABLE ServiceLock {
   public:
    explicit ServiceLock(CoordinatorService* service,
                         const char* site = __builtin_FUNCTION())
        ABSL_EXCLUSIVE_LOCK_FUNCTION(service->mu_);
    ~ServiceLock() ABSL_UNLOCK_FUNCTION();
    ServiceLock(const ServiceLock&) = delete;
    ServiceLock& operator=(const ServiceLock&) = delete;
    // The hold handles a session message of this kind (its TrainerMessage
    // field number): named in the slow-hold log line, and its CPU time
    // counted by kind (CoordinatorMetrics::message_lock_cpu).
    void set_message(int message_case);

   private:
    CoordinatorService* const service_;
    const char* const site_;
    const char* detail_ = nullptr;
    prometheus::Counter* message_cpu_ = nullptr;
    absl::Time acquired_;
    absl::Duration cpu_at_acquire_;
  };
  // Slow holds logged in the current second, and which second (unix).
  std::atomic<int64_t> slow_hold_second_{0};
  std::atomic<int> slow_holds_logged_{0};
  CoordinatorState state_ ABSL_GUARDED_BY(mu_);
  LeaseTable leases_ ABSL_GUARDED_BY(mu_);
  WorkQueues queues_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobRuntime> runtime_ ABSL_GUARDED_BY(mu_);
  SessionTable sessions_ ABSL_GUARDED_BY(mu_);
  // Under its own lock: heartbeats are recorded without mu_.
  DataServerRegistry data_servers_;
  // Decides grants from queues_ and routes them over data_servers_.
  Granter granter_ ABSL_GUARDED_BY(mu_);
  // One above the newest fence any data server reported having seen (raised
  // by heartbeats without mu_).
  std::atomic<uint64_t> seen_fence_floor_{1};
  // Raises seen_fence_floor_ above `max_fence_seen` (capped).
  void RaiseSeenFenceFloor(uint64_t max_fence_seen);

  // Created once the journal is replayed; gone before the journal.
  std::unique_ptr<DurableOutbox> outbox_;
  std::unique_ptr<OnceBarrier> once_barrier_;

  void RunExpiry();
  int ExpireLeasesImpl(bool stall_check);
  // Gives every live lease and data server a fresh TTL (after a stall).
  void RefreshLiveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends Revoke{lease_id, why} to `holder`'s open session, if it has one.
  void RevokeLocked(const std::string& holder, const std::string& lease_id,
                    const std::string& why, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopExpiryThread();
  absl::Mutex expiry_mu_;
  bool expiry_stopping_ ABSL_GUARDED_BY(expiry_mu_) = false;
  // When the previous ExpiryTick ended, by options_.stall_clock
  // (InfinitePast before the first).
  absl::Time last_tick_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread expiry_thread_;
  // Plans epochs ahead (PlanNextEpochAheadLocked); gone first.
  std::unique_ptr<ThreadPool> planner_;
  absl::Mutex hello_plan_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Writes journal compactions (MaybeCompactLocked); gone with planner_.
  std::unique_ptr<ThreadPool> compactor_;
  bool compacting_ ABSL_GUARDED_BY(mu_) = false;
  int64_t compactions_finished_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_plan_serial_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
