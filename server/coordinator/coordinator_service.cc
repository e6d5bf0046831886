#include "server/coordinator/coordinator_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/common/lease_token.h"
#include "server/common/logging.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/coordinator/audit.h"
#include "server/coordinator/coordinator_service_internal.h"
#include "server/coordinator/job_report.h"
#include "server/coordinator/memory_journal.h"
#include "server/coordinator/tenant_limits.h"

namespace sluice {

using coordinator_internal::Invalid;
using coordinator_internal::JobDoneMessage;
using coordinator_internal::kMaxFenceSeen;
using coordinator_internal::kMaxIdBytes;
using coordinator_internal::kMaxReadersPerJob;
using coordinator_internal::kMaxWorkersPerRank;
using coordinator_internal::LiveLease;
using coordinator_internal::Rejected;
using v1::CoordinatorMessage;

CoordinatorService::CoordinatorService(const CoordinatorOptions& options)
    : options_(options),
      leases_(options.clock),
      data_servers_(options.clock, 3 * options.heartbeat_interval),
      granter_(&queues_, &data_servers_, options.clock,
               options.prefetch_hint_units,
               options.steer_shared_shards ? &leases_ : nullptr),
      planner_(std::make_unique<ThreadPool>(1)),
      compactor_(std::make_unique<ThreadPool>(1)) {}

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(
    const CoordinatorOptions& options, RecoveredJournal recovered) {
  std::unique_ptr<CoordinatorService> service(new CoordinatorService(options));
  if (!options.manifest_roots.empty()) {
    ASSIGN_OR_RETURN(PathRoots roots, PathRoots::Create(options.manifest_roots,
                                                        "--manifest_roots"));
    service->manifest_roots_.emplace(std::move(roots));
  }
  absl::MutexLock lock(&service->mu_);
  if (recovered.journal == nullptr) {
    recovered.journal = std::make_unique<MemoryJournal>();
  }
  service->journal_ = std::move(recovered.journal);
  service->state_ = std::move(recovered.state);
  service->recovered_records_ = recovered.replayed_records;
  // The next compaction waits until the journal has doubled.
  service->last_snapshot_bytes_ = service->journal_->bytes_written();
  // Recovered leases get a fresh TTL (as etcd does) and the grace to
  // reconnect: their holders may be noticing only now that the coordinator
  // they held them from is gone.
  for (const auto& [name, job] : service->state_.jobs()) {
    service->RebuildQueuesLocked(name);
    for (const auto& [id, d] : job.leases) {
      RETURN_IF_ERROR(service->leases_.Add(LiveLease(d, job),
                                           service->RecoveryTtlLocked(job)));
    }
  }
  if (service->recovered_records_ > 0) {
    LogInfo(
        "recovered %d journal records: %d jobs, %d live leases (fresh TTLs)",
        service->recovered_records_, service->state_.jobs().size(),
        service->leases_.size());
  }
  service->UpdateGaugesLocked();
  service->outbox_ =
      std::make_unique<DurableOutbox>(service->journal_.get(), options.metrics);
  OnceBarrier::Options once;
  once.clock = options.clock;
  once.heartbeat_interval = options.heartbeat_interval;
  once.max_barrier_participants = options.max_barrier_participants;
  if (CoordinatorMetrics* m = options.metrics) {
    once.on_barrier_waiting = [m](size_t n) {
      m->barrier_waiting.Set(static_cast<double>(n));
    };
  }
  CoordinatorService* const svc = service.get();
  once.persist = [svc](const v1::internal::OnceFinished& f,
                       std::function<void(const absl::Status&)> done) {
    svc->PersistOnceFinished(f, std::move(done));
  };
  once.find_finished = [svc](const std::string& scope,
                             const std::string& name) {
    return svc->FindOnceFinished(scope, name);
  };
  service->once_barrier_ = std::make_unique<OnceBarrier>(std::move(once));
  return service;
}

namespace {
// The calling thread's CPU time (user + system).
absl::Duration ThreadCpuTime() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}
}  // namespace

CoordinatorService::ServiceLock::ServiceLock(CoordinatorService* service,
                                             const char* site)
    : service_(service), site_(site) {
  const absl::Time asked = absl::Now();
  service_->mu_.Lock();
  acquired_ = absl::Now();
  if (CoordinatorMetrics* m = service_->options_.metrics) {
    m->lock_wait.Observe(absl::ToDoubleSeconds(acquired_ - asked));
    cpu_at_acquire_ = ThreadCpuTime();
  }
}

void CoordinatorService::ServiceLock::set_message(int message_case) {
  if (const google::protobuf::FieldDescriptor* kind =
          v1::TrainerMessage::descriptor()->FindFieldByNumber(message_case);
      kind != nullptr) {
    detail_ = kind->name().c_str();
  }
  if (CoordinatorMetrics* m = service_->options_.metrics)
    message_cpu_ = m->message_lock_cpu(message_case);
}

CoordinatorService::ServiceLock::~ServiceLock() {
  CoordinatorMetrics* m = service_->options_.metrics;
  const absl::Duration cpu =
      m != nullptr ? ThreadCpuTime() - cpu_at_acquire_ : absl::ZeroDuration();
  const absl::Duration held = absl::Now() - acquired_;
  service_->mu_.Unlock();
  if (m == nullptr) return;
  m->lock_hold.Observe(absl::ToDoubleSeconds(held));
  m->lock_hold_cpu.Observe(absl::ToDoubleSeconds(cpu));
  if (message_cpu_ != nullptr)
    message_cpu_->Increment(absl::ToDoubleSeconds(cpu));
  if (cpu <= kSlowLockHold) return;
  const int64_t second = absl::ToUnixSeconds(absl::Now());
  if (service_->slow_hold_second_.exchange(second) != second)
    service_->slow_holds_logged_ = 0;
  if (service_->slow_holds_logged_.fetch_add(1) < 10) {
    LogWarning("%s%s%s held the state lock for %s of CPU time (%s in all)",
               site_, detail_ != nullptr ? " " : "",
               detail_ != nullptr ? detail_ : "", absl::FormatDuration(cpu),
               absl::FormatDuration(held));
  }
}

absl::Duration CoordinatorService::TtlLocked(const JobData& job) const {
  if (job.spec.lease_ttl_ms() > 0)
    return absl::Milliseconds(job.spec.lease_ttl_ms());
  // Long enough that the job's readers, heartbeating at kHeartbeatShareOfTtl
  // of it, stay within kHeartbeatsPerSecondPerJob together.
  const int64_t readers =
      static_cast<int64_t>(std::max(job.spec.world_size(), 1)) *
      std::max(job.plan.workers_per_rank, 1);
  const absl::Duration fits_budget =
      absl::Seconds(static_cast<double>(readers) / kHeartbeatsPerSecondPerJob /
                    kHeartbeatShareOfTtl);
  return std::max(options_.default_lease_ttl,
                  absl::Ceil(fits_budget, absl::Milliseconds(1)));
}

absl::Status CoordinatorService::CommitLocked(JournalRecord record,
                                              Effects& fx) {
  record.set_time_unix_ms(absl::ToUnixMillis(options_.clock->Now()));
  if (record.record_case() == JournalRecord::kJobCreated) {
    // Never refused (CreateJob validated the spec): journaled first, so the
    // state can take the manifest over instead of copying it.
    fx.ticket = journal_->Enqueue(record);
    RETURN_IF_ERROR(state_.Apply(std::move(record)));
  } else {
    // Applied first: a record the state refuses (it changes nothing then)
    // never reaches the journal, whose replay would refuse it too.
    RETURN_IF_ERROR(state_.Apply(record));
    fx.ticket = journal_->Enqueue(record);
  }
  MaybeCompactLocked();
  return absl::OkStatus();
}

void CoordinatorService::MaybeCompactLocked() {
  const int64_t size = journal_->bytes_written();
  if (compacting_ || options_.journal_compact_bytes <= 0 ||
      size < options_.journal_compact_bytes ||
      size < 2 * last_snapshot_bytes_) {
    return;
  }
  // The snapshot is of the state after every record enqueued so far: taken
  // here, under the lock, with the journal's mark. Serialising and writing
  // it happens on the compactor's thread while the service goes on.
  compacting_ = true;
  const absl::Time start = absl::Now();
  journal_->BeginCompaction();
  auto snapshot = std::make_shared<JournalRecord>(state_.Snapshot());
  snapshot->set_time_unix_ms(absl::ToUnixMillis(options_.clock->Now()));
  compactor_->Schedule([this, snapshot, size, start] {
    absl::Status status = journal_->FinishCompaction(*snapshot);
    const int64_t after = journal_->bytes_written();
    // The compaction made the records it wrote durable: what waits for
    // them goes out now.
    DeliverReady();
    ServiceLock lock(this);
    compacting_ = false;
    ++compactions_finished_;
    if (!status.ok()) {
      // Not fatal: the journal keeps growing and compaction is retried
      // once it has grown as much again.
      LogWarning("journal compaction failed (the journal is unchanged): %s",
                 status.message());
      last_snapshot_bytes_ = size;
      return;
    }
    last_snapshot_bytes_ = after;
    LogInfo("journal compacted: %d -> %d bytes in %s", size, after,
            absl::FormatDuration(absl::Now() - start));
    if (options_.metrics != nullptr) options_.metrics->compactions.Increment();
  });
}

int64_t CoordinatorService::WaitForCompactions() {
  absl::Notification reached;
  compactor_->Schedule([&reached] { reached.Notify(); });
  reached.WaitForNotification();
  ServiceLock lock(this);
  return compactions_finished_;
}

void CoordinatorService::Flush() { outbox_->Flush(); }

void CoordinatorService::WaitForPlansAhead() {
  // One thread, first in first out: done once this task runs.
  absl::Notification reached;
  planner_->Schedule([&reached] { reached.Notify(); });
  reached.WaitForNotification();
}

std::pair<int64_t, int64_t> CoordinatorService::PlansTakenAndComputed() {
  ServiceLock lock(this);
  return {state_.plans_offered_taken(), state_.plans_computed()};
}

CoordinatorService::~CoordinatorService() {
  // Their tasks take mu_ and use state_ and the journal: finished while
  // those exist.
  planner_.reset();
  compactor_.reset();
  StopExpiryThread();
  // Whatever is left goes out once durable, before the journal closes: the
  // Once outcomes waiting for their record too, so the OnceBarrier they
  // report to goes after the outbox.
  outbox_.reset();
  once_barrier_.reset();
}

void CoordinatorService::StartExpiryThread() {
  absl::MutexLock lock(&expiry_mu_);
  if (expiry_thread_.joinable() || expiry_stopping_) return;
  expiry_thread_ = std::thread([this] { RunExpiry(); });
}

void CoordinatorService::StopExpiryThread() {
  {
    absl::MutexLock lock(&expiry_mu_);
    expiry_stopping_ = true;
  }
  if (expiry_thread_.joinable()) expiry_thread_.join();
}

void CoordinatorService::RunExpiry() {
  constexpr absl::Duration kMaxSleep = absl::Milliseconds(100);
  absl::MutexLock lock(&expiry_mu_);
  while (!expiry_stopping_) {
    expiry_mu_.Unlock();
    const absl::Duration until_next = NextExpiry() - options_.clock->Now();
    expiry_mu_.Lock();
    expiry_mu_.AwaitWithTimeout(
        absl::Condition(&expiry_stopping_),
        std::clamp(until_next, absl::ZeroDuration(), kMaxSleep));
    if (expiry_stopping_) break;
    expiry_mu_.Unlock();
    ExpiryTick();
    expiry_mu_.Lock();
  }
}

namespace {

// Calls `call` with a reply function and waits for its reply.
template <typename T>
T AwaitReply(const std::function<void(std::function<void(T)>)>& call) {
  absl::Notification replied;
  std::optional<T> result;
  call([&](T r) {
    result.emplace(std::move(r));
    replied.Notify();
  });
  replied.WaitForNotification();
  return *std::move(result);
}

}  // namespace

void CoordinatorService::CreateJob(const v1::JobSpec& request, JobReply done) {
  absl::StatusOr<v1::JobSpec> normalized = NormalizeJobSpec(
      request,
      ManifestFiles{manifest_roots_ ? &*manifest_roots_ : nullptr,
                    options_.max_manifest_bytes},
      options_.job_limits);
  if (!normalized.ok()) return done(normalized.status());
  v1::JobSpec spec = *std::move(normalized);
  absl::Status refused;
  {
    ServiceLock lock(this);
    Effects fx;
    if (const JobData* existing = state_.FindJob(spec.name())) {
      // A journal may hold 10,000 ms for a job whose request left the TTL
      // unset: the same spec.
      if (spec.lease_ttl_ms() == 0 && existing->spec.lease_ttl_ms() == 10000)
        spec.set_lease_ttl_ms(10000);
      if (!google::protobuf::util::MessageDifferencer::Equals(existing->spec,
                                                              spec)) {
        refused = absl::AlreadyExistsError(
            absl::StrCat("job ", spec.name(), " exists with a different spec"));
      } else {
        // The same job again: answered once what it reports is durable.
        fx.replies.push_back([done, job = JobToProtoLocked(*existing, false)](
                                 const absl::Status& durable) mutable {
          if (!durable.ok()) return done(durable);
          done(std::move(job));
        });
        SubmitLocked(fx);
      }
    } else if (absl::Status limit = CheckTenantJobs(
                   state_.jobs(), spec.tenant(), options_.max_jobs_per_tenant);
               !limit.ok()) {
      refused = std::move(limit);
    } else {
      const std::string name = spec.name();
      JournalRecord record;
      *record.mutable_job_created()->mutable_spec() =
          std::move(spec);  // moved, not copied
      refused = CommitLocked(std::move(record), fx);
      if (refused.ok()) {
        RebuildQueuesLocked(name);
        UpdateGaugesLocked();
        // The reply depends on the record: it leaves once that is durable.
        fx.replies.push_back([done, job = JobToProtoLocked(
                                        *state_.FindJob(name), false)](
                                 const absl::Status& durable) mutable {
          if (!durable.ok()) return done(durable);
          LogInfo("created job %s: %d shards, %d samples/epoch, world_size %d",
                  job.spec().name(), job.status().num_shards(),
                  job.status().samples_per_epoch(), job.spec().world_size());
          done(std::move(job));
        });
        SubmitLocked(fx);
      }
    }
  }
  if (!refused.ok()) return done(refused);
  DeliverReady();
}

absl::StatusOr<v1::Job> CoordinatorService::CreateJob(const v1::JobSpec& spec) {
  return AwaitReply<absl::StatusOr<v1::Job>>(
      [&](JobReply done) { CreateJob(spec, std::move(done)); });
}

void CoordinatorService::CopyJob(const std::string& source,
                                 const std::string& name, int32_t world_size,
                                 JobReply done) {
  std::optional<v1::JobSpec> spec;
  {
    ServiceLock lock(this);
    if (const JobData* job = state_.FindJob(source)) spec = job->spec;
  }
  if (!spec.has_value()) {
    return done(absl::NotFoundError(
        absl::StrCat("copy_of: job ", QuotePrefix(source), " not found")));
  }
  spec->set_name(name);
  spec->set_world_size(world_size);
  CreateJob(*spec, std::move(done));
}

absl::StatusOr<v1::Job> CoordinatorService::CopyJob(const std::string& source,
                                                    const std::string& name,
                                                    int32_t world_size) {
  return AwaitReply<absl::StatusOr<v1::Job>>([&](JobReply done) {
    CopyJob(source, name, world_size, std::move(done));
  });
}

void CoordinatorService::GetJob(const std::string& name, bool include_manifest,
                                JobReply done) {
  bool found = false;
  {
    ServiceLock lock(this);
    if (const JobData* job = state_.FindJob(name)) {
      found = true;
      // The state takes a record before the journal has it: a report waits
      // for the records it includes, so nothing it shows (an acknowledged
      // count, a lease) can be undone by a crash.
      Effects fx;
      fx.replies.push_back(
          [done, report = JobToProtoLocked(*job, include_manifest)](
              const absl::Status& durable) mutable {
            if (!durable.ok()) return done(durable);
            done(std::move(report));
          });
      SubmitLocked(fx);
    }
  }
  if (!found) {
    return done(absl::NotFoundError(
        absl::StrCat("job ", QuotePrefix(name), " not found")));
  }
  DeliverReady();
}

absl::StatusOr<v1::Job> CoordinatorService::GetJob(const std::string& name,
                                                   bool include_manifest) {
  return AwaitReply<absl::StatusOr<v1::Job>>(
      [&](JobReply done) { GetJob(name, include_manifest, std::move(done)); });
}

void CoordinatorService::Audit(const v1::AuditRequest& request,
                               AuditReply done) {
  std::optional<absl::StatusOr<AuditSlice>> slice;
  {
    ServiceLock lock(this);
    if (const JobData* job = state_.FindJob(request.job())) {
      slice = SliceAudit(*job, request, queues_.Windows(*job));
      if (slice->ok()) {
        // Named once what the slice shows is durable, off the lock.
        Effects fx;
        const int64_t expires =
            absl::ToUnixMillis(options_.clock->Now() + kReplayLeaseTtl);
        fx.replies.push_back([done, taken = std::move(**slice), expires,
                              secret = options_.lease_secret](
                                 const absl::Status& durable) mutable {
          if (!durable.ok()) return done(durable);
          done(NameAuditedSamples(std::move(taken), [&](v1::Lease* lease) {
            lease->set_expires_at_unix_ms(expires);
            if (!secret.empty()) lease->set_token(SignLease(*lease, secret));
          }));
        });
        SubmitLocked(fx);
      }
    }
  }
  if (!slice.has_value()) {
    return done(absl::NotFoundError(
        absl::StrCat("job ", QuotePrefix(request.job()), " not found")));
  }
  if (!slice->ok()) return done(slice->status());
  DeliverReady();
}

absl::StatusOr<v1::AuditResponse> CoordinatorService::Audit(
    const v1::AuditRequest& request) {
  return AwaitReply<absl::StatusOr<v1::AuditResponse>>(
      [&](AuditReply done) { Audit(request, std::move(done)); });
}

void CoordinatorService::ListJobs(JobsReply done) {
  {
    ServiceLock lock(this);
    std::vector<v1::Job> jobs;
    for (const auto& [name, job] : state_.jobs())
      jobs.push_back(JobToProtoLocked(job, false));
    Effects fx;
    fx.replies.push_back(
        [done, jobs = std::move(jobs)](const absl::Status& durable) mutable {
          if (!durable.ok()) return done(durable);
          done(std::move(jobs));
        });
    SubmitLocked(fx);
  }
  DeliverReady();
}

absl::StatusOr<std::vector<v1::Job>> CoordinatorService::ListJobs() {
  return AwaitReply<absl::StatusOr<std::vector<v1::Job>>>(
      [&](JobsReply done) { ListJobs(std::move(done)); });
}

void CoordinatorService::DeleteJob(const std::string& name, NamesReply done) {
  absl::Status refused;
  {
    ServiceLock lock(this);
    if (state_.FindJob(name) == nullptr) {
      refused = absl::NotFoundError(
          absl::StrCat("job ", QuotePrefix(name), " not found"));
    } else {
      // The copies first: a journal failure part way leaves the job itself,
      // and deleting it again finishes the work.
      std::vector<std::string> doomed;
      for (const auto& [other, job] : state_.jobs()) {
        if (IsCopyJobName(other, name)) doomed.push_back(other);
      }
      doomed.push_back(name);
      Effects fx;
      for (const std::string& job_name : doomed) {
        refused = DeleteJobLocked(job_name, fx);
        if (!refused.ok()) break;
      }
      if (refused.ok()) {
        UpdateGaugesLocked();
        fx.replies.push_back(
            [done, doomed = std::move(doomed)](const absl::Status& s) {
              if (s.ok()) return done(doomed);
              done(s);
            });
      }
      SubmitLocked(fx);
    }
  }
  if (!refused.ok()) return done(refused);
  DeliverReady();
}

absl::Status CoordinatorService::DeleteJobLocked(const std::string& name,
                                                 Effects& fx) {
  const JobData* job = state_.FindJob(name);
  for (const auto& [id, lease] : job->leases) {
    if (auto removed = leases_.Remove(id); !removed.ok()) {
      LogError("lease table out of step with the journal: %s",
               removed.status().ToString());
    }
  }
  JournalRecord record;
  record.mutable_job_deleted()->set_job(name);
  RETURN_IF_ERROR(CommitLocked(std::move(record), fx));
  queues_.Erase(name);
  runtime_.erase(name);
  for (int64_t id : sessions_.OpenIds(name, /*wanting=*/false)) {
    FinishSessionLocked(
        *sessions_.Find(id),
        absl::NotFoundError(absl::StrCat("job ", name, " was deleted")), fx);
  }
  if (options_.metrics != nullptr) options_.metrics->RemoveJob(name);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> CoordinatorService::DeleteJob(
    const std::string& name) {
  return AwaitReply<absl::StatusOr<std::vector<std::string>>>(
      [&](NamesReply done) { DeleteJob(name, std::move(done)); });
}

void CoordinatorService::PersistOnceFinished(
    const v1::internal::OnceFinished& finished,
    std::function<void(const absl::Status&)> done) {
  absl::Status refused;
  {
    ServiceLock lock(this);
    Effects fx;
    JournalRecord record;
    *record.mutable_once_finished() = finished;
    refused = CommitLocked(std::move(record), fx);
    if (refused.ok()) {
      // The outbox answers once the record is durable (or the journal
      // failed), on the thread that learns it.
      fx.replies.push_back(done);  // a copy: `done` answers a refusal below
      SubmitLocked(fx);
    }
  }
  if (!refused.ok()) return done(refused);
  DeliverReady();
}

std::vector<v1::internal::OnceFinished> CoordinatorService::ListOnceFinished(
    const std::string& scope) {
  ServiceLock lock(this);
  return state_.OnceFinishedIn(scope);
}

void CoordinatorService::ResetOnce(const std::string& scope,
                                   const std::string& name, StatusReply done) {
  absl::Status refused;
  {
    ServiceLock lock(this);
    if (state_.FindOnceFinished(scope, name) == nullptr) {
      refused = absl::NotFoundError(absl::StrCat(
          "once ", scope, "/", name, " has not finished: nothing to reset"));
    } else {
      Effects fx;
      JournalRecord record;
      record.mutable_once_reset()->set_scope(scope);
      record.mutable_once_reset()->set_name(name);
      refused = CommitLocked(std::move(record), fx);
      if (refused.ok()) {
        fx.replies.push_back(done);
        SubmitLocked(fx);
      }
    }
  }
  if (!refused.ok()) return done(refused);
  DeliverReady();
}

absl::Status CoordinatorService::ResetOnce(const std::string& scope,
                                           const std::string& name) {
  return AwaitReply<absl::Status>(
      [&](StatusReply done) { ResetOnce(scope, name, std::move(done)); });
}

std::optional<v1::internal::OnceFinished> CoordinatorService::FindOnceFinished(
    const std::string& scope, const std::string& name) {
  ServiceLock lock(this);
  const v1::internal::OnceFinished* f = state_.FindOnceFinished(scope, name);
  if (f == nullptr) return std::nullopt;
  return *f;
}

int CoordinatorService::ExpireLeases() {
  return ExpireLeasesImpl(/*stall_check=*/false);
}

int CoordinatorService::ExpiryTick() {
  const int expired = ExpireLeasesImpl(/*stall_check=*/true);
  once_barrier_->Tick();
  const absl::Time now = options_.clock->Now();
  if (options_.fleet_interval > absl::ZeroDuration() && now >= next_sizing_) {
    next_sizing_ = now + options_.fleet_interval;
    SizeFleet();
  }
  return expired;
}

CoordinatorService::PoolSizing& CoordinatorService::PoolSizingLocked(
    const std::string& pool) {
  auto it = pool_sizing_.find(pool);
  if (it == pool_sizing_.end())
    it = pool_sizing_.emplace(pool, PoolSizing(options_.fleet)).first;
  return it->second;
}

void CoordinatorService::SizeFleet() {
  ServiceLock lock(this);
  const absl::Time now = options_.clock->Now();
  // Every pool with a job or a registered server is sized; a pool left
  // with neither (its jobs deleted, its servers gone) is forgotten, so it
  // no longer adds its minimum to the total.
  std::set<std::string> pools;
  for (const auto& [name, job] : state_.jobs()) pools.insert(job.spec.pool());
  const std::map<std::string, DataServerRegistry::PoolCounts> counts =
      data_servers_.CountsByPool();
  for (const auto& [pool, c] : counts) pools.insert(pool);
  for (auto it = pool_sizing_.begin(); it != pool_sizing_.end();) {
    if (pools.count(it->first) > 0) {
      ++it;
      continue;
    }
    if (options_.metrics != nullptr) options_.metrics->RemovePool(it->first);
    it = pool_sizing_.erase(it);
  }
  for (const std::string& pool : pools) PoolSizingLocked(pool);
  const std::map<std::string, DataServerRegistry::Load> loads =
      data_servers_.TakeLoadByPool();
  if (last_sizing_ == absl::InfinitePast()) {
    // The first call only starts the counts (and the servers' baselines).
    last_sizing_ = now;
    for (auto& [pool, sizing] : pool_sizing_) {
      sizing.consumed = 0;
      sizing.wait_seconds = 0;
    }
    return;
  }
  std::map<std::string, int32_t> readers;
  for (const auto& [job, open] : sessions_.OpenCounts()) {
    const JobData* data = state_.FindJob(job);
    if (data != nullptr)
      readers[data->spec.pool()] += static_cast<int32_t>(open);
  }
  int32_t desired_total = 0;
  double wait_total = 0;
  int32_t readers_total = 0;
  for (auto& [pool, sizing] : pool_sizing_) {
    const auto load = loads.find(pool);
    const auto count = counts.find(pool);
    FleetSample s;
    s.time = now;
    s.consumed = sizing.consumed;
    s.wait_seconds = sizing.wait_seconds;
    s.readers = readers[pool];
    s.reader_seconds = s.readers * absl::ToDoubleSeconds(now - last_sizing_);
    if (load != loads.end()) {
      s.served = load->second.samples_served;
      s.server_cpu_seconds = load->second.cpu_seconds;
      s.cores_per_server = load->second.cores;
    }
    s.live_servers = count != counts.end() ? count->second.live : 0;
    const int32_t desired = sizing.sizer.Update(s);
    const FleetSizer::Measures& m = sizing.sizer.measures();
    if (desired != sizing.desired) {
      LogInfo(
          "data servers wanted%s%s: %d (%d live; trainers wait %.0f%% of the "
          "time, consume %.0f samples/s; one server serves %.0f/s)",
          pool.empty() ? "" : " in pool ", pool, desired, s.live_servers,
          100 * m.wait_share, m.consumed_per_second, m.server_capacity);
    }
    sizing.desired = desired;
    sizing.wait_share = m.wait_share;
    sizing.consumed = 0;
    sizing.wait_seconds = 0;
    desired_total += desired;
    wait_total += m.wait_share * s.readers;
    readers_total += s.readers;
    if (options_.metrics != nullptr)
      options_.metrics->PoolDesiredDataServers(pool).Set(desired);
  }
  last_sizing_ = now;
  const double share = readers_total > 0 ? wait_total / readers_total : 0;
  desired_data_servers_.store(desired_total);
  input_wait_share_.store(share);
  if (options_.metrics != nullptr) {
    options_.metrics->desired_data_servers.Set(desired_total);
    options_.metrics->input_wait_share.Set(share);
  }
}

std::vector<v1::PoolFleet> CoordinatorService::PoolFleets() {
  const std::map<std::string, DataServerRegistry::PoolCounts> counts =
      data_servers_.CountsByPool();
  ServiceLock lock(this);
  std::map<std::string, v1::PoolFleet> out;
  for (const auto& [name, job] : state_.jobs()) out[job.spec.pool()];
  for (const auto& [pool, c] : counts) {
    out[pool].set_live_data_servers(c.live);
    out[pool].set_draining_data_servers(c.draining);
  }
  std::vector<v1::PoolFleet> fleets;
  for (auto& [pool, fleet] : out) {
    fleet.set_pool(pool);
    auto sizing = pool_sizing_.find(pool);
    fleet.set_desired_data_servers(
        sizing != pool_sizing_.end() ? sizing->second.desired : -1);
    fleet.set_input_wait_share(
        sizing != pool_sizing_.end() ? sizing->second.wait_share : 0);
    fleets.push_back(std::move(fleet));
  }
  return fleets;
}

void CoordinatorService::RefreshLiveLocked() {
  int refreshed = 0;
  for (const auto& [name, job] : state_.jobs()) {
    const absl::Duration ttl = RecoveryTtlLocked(job);
    for (const auto& [id, lease] : job.leases)
      refreshed += leases_.Renew(id, ttl);
  }
  data_servers_.MarkAllSeen();
  LogInfo("gave %d live leases and every data server a fresh TTL", refreshed);
}

int CoordinatorService::ExpireLeasesImpl(bool stall_check) {
  Effects fx;
  int expired = 0;
  // Read before taking mu_: time spent waiting for the lock (a busy
  // coordinator) is no stall, only time the tick could not run at all.
  const absl::Time woke =
      stall_check ? options_.stall_clock->Now() : absl::InfinitePast();
  {
    ServiceLock lock(this);
    if (stall_check && last_tick_ != absl::InfinitePast() &&
        woke - last_tick_ > options_.stall_bound) {
      LogInfo(
          "the coordinator did not run for %s (its expiry tick came late): "
          "nothing expires for that time",
          absl::FormatDuration(woke - last_tick_));
      if (options_.metrics != nullptr) options_.metrics->stalls.Increment();
      RefreshLiveLocked();
    }
    UpdateDataServerMetric();  // servers that stopped heartbeating
    std::set<std::string> jobs;
    const absl::Time look_up =
        stall_check ? options_.stall_clock->Now() : absl::InfinitePast();
    std::vector<std::string> found = leases_.FindExpired(1024);
    if (stall_check && !found.empty() &&
        options_.stall_clock->Now() - look_up > options_.stall_bound) {
      // Stopped during the look-up: those leases lapsed while nothing ran.
      found.clear();
      if (options_.metrics != nullptr) options_.metrics->stalls.Increment();
      RefreshLiveLocked();
    }
    for (const std::string& id : found) {
      const LeaseEntry* lease = leases_.Find(id);
      if (lease == nullptr) continue;
      const std::string job = lease->job;
      const std::string holder = lease->holder;
      LogInfo("lease %s of trainer %s expired; %d samples return to the queue",
              id, holder, lease->remaining());
      EndLeaseLocked(job, id, v1::internal::LEASE_END_EXPIRED, fx);
      // A holder that was only paused reads this before any later Synced,
      // and drops what it buffered of the lease.
      RevokeLocked(holder, id,
                   absl::StrCat("lease ", id,
                                " expired: no message from its holder for "
                                "the lease TTL"),
                   fx);
      jobs.insert(job);
      ++expired;
    }
    for (const std::string& job : jobs)
      PumpLocked(job, fx, PumpScope::kWanting);
    UpdateGaugesLocked();
    UpdateRankSkewLocked();
    if (stall_check) last_tick_ = options_.stall_clock->Now();
    SubmitLocked(fx);
  }
  DeliverReady();
  return expired;
}

void CoordinatorService::UpdateRankSkewLocked() {
  CoordinatorMetrics* m = options_.metrics;
  if (m == nullptr) return;
  // O(ranks) per job: on the expiry tick, not on every lease message.
  for (const auto& [name, job] : state_.jobs()) {
    int64_t most = 0, least = 0;
    for (int32_t r = 0; r < job.plan.num_ranks; ++r) {
      const int64_t consumed = job.consumed_by_rank(r);
      most = r == 0 ? consumed : std::max(most, consumed);
      least = r == 0 ? consumed : std::min(least, consumed);
    }
    m->ForJob(name).rank_skew->Set(static_cast<double>(most - least));
  }
}

absl::Time CoordinatorService::NextExpiry() {
  ServiceLock lock(this);
  return leases_.NextExpiry();
}

void CoordinatorService::Drain() {
  StopExpiryThread();
  Effects fx;
  {
    ServiceLock lock(this);
    for (int64_t id : sessions_.Ids()) {
      FinishSessionLocked(
          *sessions_.Find(id),
          absl::UnavailableError("coordinator is shutting down; reconnect"),
          fx);
    }
    SubmitLocked(fx);
  }
  DeliverReady();
}

void CoordinatorService::UpdateGaugesLocked() {
  CoordinatorMetrics* m = options_.metrics;
  if (m == nullptr) return;
  m->jobs.Set(static_cast<double>(state_.jobs().size()));
  m->live_leases.Set(static_cast<double>(leases_.size()));
  for (const auto& [name, job] : state_.jobs()) {
    const CoordinatorMetrics::Job& series = m->ForJob(name);
    series.epoch_samples->Set(static_cast<double>(job.served_per_epoch()));
    series.epoch_completed->Set(static_cast<double>(job.consumed_total));
    series.epoch->Set(static_cast<double>(job.epoch));
    if (job.mix != nullptr) {
      const std::vector<int64_t> counts = job.mix->EpochCounts(job.epoch);
      for (size_t s = 0; s < counts.size(); ++s) {
        m->SetSource(
            name, job.mix->sources()[s].name, counts[s],
            s < job.consumed_per_source.size() ? job.consumed_per_source[s] : 0,
            s < job.consumed_per_source_total.size()
                ? job.consumed_per_source_total[s]
                : 0);
      }
    }
  }
}

v1::Job CoordinatorService::JobToProtoLocked(const JobData& job,
                                             bool include_manifest) {
  JobSoftState soft;
  soft.live_data_servers = data_servers_.LiveAddressesIn(job.spec.pool());
  if (auto rt = runtime_.find(job.spec.name()); rt != runtime_.end()) {
    soft.lease_counts = &rt->second.lease_counts;
    soft.input_wait_by_rank = &rt->second.input_wait_by_rank;
  }
  if (const SessionTable::Open* open = sessions_.OpenOf(job.spec.name());
      open != nullptr) {
    soft.sessions_per_rank = &open->per_rank;
  }
  return JobToProto(job, include_manifest, soft);
}

v1::Lease CoordinatorService::LeaseToProtoLocked(const LeaseEntry& lease,
                                                 const JobData& job) {
  // Empty for a job without windows (not copied: this runs per grant).
  v1::Lease out = LeaseToProto(lease, job, queues_.Windows(job));
  // Trials of a sweep: another job with readers open reads the same shards.
  if (job.shards_fingerprint != 0 &&
      sessions_.AnyOtherJobOpen(job.spec.name(), [&](const std::string& name) {
        const JobData* other = state_.FindJob(name);
        return other != nullptr && !other->done &&
               other->shards_fingerprint == job.shards_fingerprint;
      })) {
    out.set_shared_shards(true);
  }
  if (!options_.lease_secret.empty()) {
    out.set_token(SignLease(out, options_.lease_secret));
    leases_.SetTokenExpiry(lease.lease_id,
                           lease.expires_at);  // sent to the holder
  }
  return out;
}

// Data servers: registration, heartbeats and liveness (the registry
// itself is data_server_registry.h).

int64_t CoordinatorService::RegisterDataServer(
    const std::string& address, int32_t capacity,
    std::shared_ptr<DataServerSink> sink, uint64_t max_fence_seen,
    const std::string& node, const std::string& pool) {
  Effects fx;
  int64_t id;
  {
    ServiceLock lock(this);
    RaiseSeenFenceFloor(max_fence_seen);
    const bool none_live = !data_servers_.AnyLiveIn(pool);
    if (sink != nullptr) {
      // Under mu_, so the reply precedes any hint for this server.
      v1::CoordinatorToDataServer reply;
      reply.mutable_registered()->set_heartbeat_interval_ms(
          absl::ToInt64Milliseconds(data_server_timeout() / 3));
      reply.mutable_registered()->set_heartbeat_timeout_ms(
          absl::ToInt64Milliseconds(data_server_timeout()));
      reply.mutable_registered()->set_acks_heartbeats(true);
      sink->Send(reply);
    }
    id = data_servers_.Add(address, capacity, std::move(sink), node, pool);
    UpdateDataServerMetric();
    if (none_live) PumpAllLocked(fx);  // units waiting for a data server
    SubmitLocked(fx);
  }
  DeliverReady();
  return id;
}

void CoordinatorService::RaiseSeenFenceFloor(uint64_t max_fence_seen) {
  const uint64_t floor = std::min(max_fence_seen, kMaxFenceSeen) + 1;
  uint64_t now = seen_fence_floor_.load();
  while (now < floor && !seen_fence_floor_.compare_exchange_weak(now, floor)) {
  }
}

void CoordinatorService::DataServerHeartbeat(
    int64_t id, uint64_t max_fence_seen, const DataServerRegistry::Load* load) {
  RaiseSeenFenceFloor(max_fence_seen);
  bool none_was_live = false;
  if (!data_servers_.Heartbeat(id, &none_was_live, load)) return;
  UpdateDataServerMetric();
  if (!none_was_live) return;
  // The first live server again: the units waiting for one go out.
  Effects fx;
  {
    ServiceLock lock(this);
    PumpAllLocked(fx);
    SubmitLocked(fx);
  }
  DeliverReady();
}

void CoordinatorService::UnregisterDataServer(int64_t id) {
  ServiceLock lock(this);
  data_servers_.Remove(id);
  UpdateDataServerMetric();
}

void CoordinatorService::DataServerDraining(int64_t id) {
  const std::optional<std::string> address = data_servers_.SetDraining(id);
  if (!address.has_value()) return;
  UpdateDataServerMetric();
  LogInfo("data server %s is draining: routing it nothing new", *address);
  // Its leases' holders give back the ones they have not started reading.
  Effects fx;
  {
    ServiceLock lock(this);
    v1::CoordinatorMessage leaving;
    leaving.mutable_leaving()->set_data_server(*address);
    for (const std::string& holder : leases_.HoldersOn(*address)) {
      if (Session* session = sessions_.SessionOf(holder); session != nullptr) {
        fx.sends.emplace_back(session->sink, leaving);
      }
    }
    SubmitLocked(fx);
  }
  DeliverReady();
}

std::vector<std::string> CoordinatorService::LiveDataServers() {
  ServiceLock lock(this);
  return data_servers_.LiveAddresses();
}

void CoordinatorService::UpdateDataServerMetric() {
  if (options_.metrics == nullptr) return;
  options_.metrics->data_servers.Set(data_servers_.LiveCount());
  options_.metrics->draining_data_servers.Set(data_servers_.DrainingCount());
}

// The trainer Session protocol: Hello, resume, workers, heartbeats with
// input wait, Progress / Complete / Reroute / Release.

int64_t CoordinatorService::OpenSession(std::shared_ptr<SessionSink> sink) {
  ServiceLock lock(this);
  const int64_t id = sessions_.Add(std::move(sink)).id;
  UpdateGaugesLocked();
  return id;
}

void CoordinatorService::CloseSession(int64_t session_id) {
  ServiceLock lock(this);
  Session* s = sessions_.Find(session_id);
  if (s == nullptr) return;
  if (s->hello && options_.metrics != nullptr &&
      state_.FindJob(s->job) != nullptr) {
    options_.metrics->ForJob(s->job).sessions->Decrement();
  }
  const std::string job = s->job;
  const int32_t slot = s->slot;
  if (sessions_.Remove(session_id)) NoteSlotLeftLocked(job, slot);
  UpdateGaugesLocked();
}

void CoordinatorService::FinishSessionLocked(Session& s,
                                             const absl::Status& status,
                                             Effects& fx) {
  if (s.finished) return;
  s.finished = true;
  ForgetOpenLocked(s);
  fx.finishes.emplace_back(s.sink, status);
}

void CoordinatorService::ForgetOpenLocked(const Session& s) {
  if (sessions_.Leave(s)) NoteSlotLeftLocked(s.job, s.slot);
}

void CoordinatorService::NoteSlotLeftLocked(const std::string& job,
                                            int32_t slot) {
  const JobData* data = state_.FindJob(job);
  if (data == nullptr || data->done) return;
  runtime_[job].slot_left_at[slot] = options_.clock->Now();
}

void CoordinatorService::OnMessage(int64_t session_id,
                                   const v1::TrainerMessage& message) {
  HandleMessage(session_id, message, /*may_plan_first=*/true);
}

void CoordinatorService::HandleMessage(int64_t session_id,
                                       const v1::TrainerMessage& message,
                                       bool may_plan_first) {
  Effects fx;
  bool plan_first = false;
  {
    ServiceLock lock(this);
    lock.set_message(message.msg_case());
    Session* found = sessions_.Find(session_id);
    if (found == nullptr || found->finished) return;
    Session& s = *found;
    if (may_plan_first && message.has_hello() && !s.hello &&
        HelloPlanInputsLocked(message.hello()).has_value()) {
      plan_first = true;  // below, without the lock
    } else if (message.has_hello()) {
      if (s.hello) {
        FinishSessionLocked(
            s, absl::FailedPreconditionError("session: second Hello"), fx);
      } else {
        HandleHelloLocked(s, message.hello(), fx);
      }
    } else if (!s.hello) {
      FinishSessionLocked(s,
                          absl::FailedPreconditionError(
                              "session: the first message must be Hello"),
                          fx);
    } else {
      leases_.RenewHolder(s.trainer_id, TtlLocked(*state_.FindJob(s.job)));
      RefreshTokensLocked(s, fx);
      absl::Status status = HandleLeaseMessageLocked(s, message, fx);
      if (!status.ok()) FinishSessionLocked(s, status, fx);
    }
    if (!plan_first) {
      UpdateGaugesLocked();
      SubmitLocked(fx);
    }
  }
  if (plan_first) {
    // The epoch for the Hello's readers per rank is planned and offered;
    // the Hello is then handled as if just received (and installs it).
    PlanForHello(message.hello());
    HandleMessage(session_id, message, /*may_plan_first=*/false);
    return;
  }
  DeliverReady();
}

void CoordinatorService::HandleHelloLocked(Session& s, const v1::Hello& hello,
                                           Effects& fx) {
  if (hello.trainer_id().size() > kMaxIdBytes ||
      hello.resume_attempt().size() > kMaxIdBytes ||
      hello.launch_id().size() > kMaxIdBytes ||
      hello.node().size() > kMaxIdBytes) {
    const char* field =
        hello.trainer_id().size() > kMaxIdBytes       ? "hello.trainer_id"
        : hello.resume_attempt().size() > kMaxIdBytes ? "hello.resume_attempt"
        : hello.launch_id().size() > kMaxIdBytes      ? "hello.launch_id"
                                                      : "hello.node";
    FinishSessionLocked(
        s,
        Invalid(field, absl::StrCat("trainer_id, resume_attempt, "
                                    "launch_id and node are limited "
                                    "to ",
                                    kMaxIdBytes, " bytes")),
        fx);
    return;
  }
  const JobData* job = state_.FindJob(hello.job());
  if (job == nullptr) {
    FinishSessionLocked(s,
                        absl::NotFoundError(absl::StrCat(
                            "job ", QuotePrefix(hello.job()), " not found")),
                        fx);
    return;
  }
  const int64_t open_sessions = sessions_.OpenCount(hello.job());
  if (open_sessions >= options_.max_sessions_per_job) {
    FinishSessionLocked(
        s,
        absl::ResourceExhaustedError(absl::StrCat(
            "job ", hello.job(), " has ", open_sessions,
            " open sessions; the limit is ", options_.max_sessions_per_job)),
        fx);
    return;
  }
  if (absl::Status limit =
          options_.max_sessions_per_tenant > 0
              ? CheckTenantSessions(state_.jobs(), sessions_.OpenCounts(),
                                    job->spec.tenant(),
                                    options_.max_sessions_per_tenant)
              : absl::OkStatus();
      !limit.ok()) {
    FinishSessionLocked(s, limit, fx);
    return;
  }
  const int32_t ws = job->spec.world_size();
  if (hello.rank() < 0 || (ws > 0 && hello.rank() >= ws) ||
      (ws == 0 && hello.rank() != 0)) {
    FinishSessionLocked(s,
                        absl::InvalidArgumentError(absl::StrCat(
                            "hello.rank=", hello.rank(),
                            " is out of range for job ", hello.job(),
                            ws > 0 ? absl::StrCat(" (world_size ", ws, ")")
                                   : " (world_size 0: use rank 0)")),
                        fx);
    return;
  }
  const int32_t workers = std::max(hello.num_workers(), 1);
  if (hello.num_workers() < 0 || hello.num_workers() > kMaxWorkersPerRank) {
    FinishSessionLocked(
        s,
        Invalid("hello.num_workers",
                absl::StrCat(hello.num_workers(), " is out of range [0, ",
                             kMaxWorkersPerRank, "]")),
        fx);
    return;
  }
  if (static_cast<int64_t>(workers) * std::max(ws, 1) > kMaxReadersPerJob) {
    FinishSessionLocked(
        s,
        Invalid("hello.num_workers",
                absl::StrCat(hello.num_workers(), " workers on each of ",
                             std::max(ws, 1), " ranks exceed the limit of ",
                             kMaxReadersPerJob, " readers per job")),
        fx);
    return;
  }
  if (hello.worker() < 0 || hello.worker() >= workers) {
    FinishSessionLocked(
        s,
        Invalid(
            "hello.worker",
            absl::StrCat(hello.worker(), " is out of range for num_workers ",
                         hello.num_workers(), " (job ", hello.job(), ")")),
        fx);
    return;
  }
  // Journaled by a resume or a new plan: the job changed for every session.
  const uint64_t ticket_before = fx.ticket;
  if (hello.has_cursor()) {
    absl::Status resumed = ResumeLocked(hello, fx);
    if (!resumed.ok()) {
      FinishSessionLocked(s, resumed, fx);
      return;
    }
  }
  if (absl::Status same = UseWorkersLocked(hello, fx); !same.ok()) {
    FinishSessionLocked(s, same, fx);
    return;
  }
  job = state_.FindJob(hello.job());
  s.hello = true;
  s.job = hello.job();
  s.rank = hello.rank();
  s.worker = hello.worker();
  s.num_workers = workers;
  s.node = hello.node();
  s.pool = job->spec.pool();
  s.slot = job->plan.SlotOf(s.rank, s.worker);
  if (options_.metrics != nullptr)
    options_.metrics->ForJob(s.job).sessions->Increment();
  // Leases follow the trainer within its job: the same trainer_id in
  // another job (one process reading two jobs) is another holder.
  s.trainer_id =
      absl::StrCat(hello.job(), "/",
                   hello.trainer_id().empty() ? absl::StrCat("session-", s.id)
                                              : hello.trainer_id());
  // One live session per trainer: a reconnect replaces the old stream.
  if (Session* old = sessions_.Join(s); old != nullptr) {
    FinishSessionLocked(
        *old,
        absl::AbortedError(absl::StrCat("trainer ", s.trainer_id,
                                        " reconnected on a new session")),
        fx);
  }
  CoordinatorMessage welcome;
  welcome.mutable_welcome()->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(HeartbeatIntervalLocked(*job, workers)));
  welcome.mutable_welcome()->set_lease_ttl_ms(
      absl::ToInt64Milliseconds(TtlLocked(*job)));
  welcome.mutable_welcome()->set_session_id(absl::StrCat(s.id));
  welcome.mutable_welcome()->set_world_size(ws);
  fx.sends.emplace_back(s.sink, std::move(welcome));
  // A reconnecting trainer keeps its leases: renew and re-announce them.
  leases_.RenewHolder(s.trainer_id, TtlLocked(*job));
  // Announces the epoch first. A Hello that changed nothing else concerns
  // only its own session: opening N sessions costs O(N), not O(N^2).
  PumpLocked(s.job, fx,
             fx.ticket != ticket_before ? PumpScope::kAll : PumpScope::kOne,
             &s);
  for (const LeaseEntry* lease : leases_.HeldBy(s.trainer_id)) {
    CoordinatorMessage grant;
    *grant.mutable_grant()->mutable_lease() = LeaseToProtoLocked(*lease, *job);
    fx.sends.emplace_back(s.sink, std::move(grant));
  }
}

absl::Duration CoordinatorService::HeartbeatIntervalLocked(
    const JobData& job, int32_t workers) const {
  const int64_t readers =
      static_cast<int64_t>(std::max(job.spec.world_size(), 1)) * workers;
  const absl::Duration budget =
      absl::Seconds(static_cast<double>(readers) / kHeartbeatsPerSecondPerJob);
  const absl::Duration cap =
      std::max(options_.heartbeat_interval,
               absl::Floor(TtlLocked(job) * kHeartbeatShareOfTtl,
                           absl::Milliseconds(1)));
  return std::min(std::max(options_.heartbeat_interval, budget), cap);
}

absl::Status CoordinatorService::ResumeLocked(const v1::Hello& hello,
                                              Effects& fx) {
  if (hello.cursor().job().size() > 128) {
    return Invalid("hello.cursor.job", "is longer than a job name (128 bytes)");
  }
  v1::internal::JobResumed resume;
  *resume.mutable_cursor() = hello.cursor();
  if (resume.cursor().job().empty())
    resume.mutable_cursor()->set_job(hello.job());
  resume.set_job(hello.job());
  resume.set_attempt(hello.resume_attempt());
  resume.set_workers_per_rank(std::max(hello.num_workers(), 1));
  const int32_t slot =
      hello.rank() * resume.workers_per_rank() + hello.worker();
  const JobData* job = state_.FindJob(hello.job());
  if (job->last_resume.has_value()) {
    v1::internal::JobResumed last = *job->last_resume;
    last.clear_launches();
    if (google::protobuf::util::MessageDifferencer::Equals(last, resume)) {
      const auto& launches = job->last_resume->launches();
      auto taken = launches.find(slot);
      if (taken != launches.end() && taken->second == hello.launch_id()) {
        return absl::OkStatus();  // the same launch again (a new worker)
      }
      if (taken == launches.end()) {
        // Another reader of the same restart.
        JournalRecord joined;
        joined.mutable_resume_joined()->set_job(hello.job());
        joined.mutable_resume_joined()->set_slot(slot);
        joined.mutable_resume_joined()->set_launch_id(hello.launch_id());
        return CommitLocked(std::move(joined), fx);
      }
      // The slot already joined from another launch: a new restart from the
      // same checkpoint, which restores that position again.
      LogInfo(
          "job %s: reader slot %d (rank %d worker %d) resumes the same cursor "
          "again from launch %s (it joined from %s): a new restart",
          hello.job(), slot, hello.rank(), hello.worker(),
          QuotePrefix(hello.launch_id()), QuotePrefix(taken->second));
    }
  }
  (*resume.mutable_launches())[slot] = hello.launch_id();
  RETURN_IF_ERROR(state_.CheckResume(resume));
  // Every live lease of the job belongs to the position being replaced.
  const std::string why =
      absl::StrCat("job ", hello.job(), " resumed from a cursor of job ",
                   resume.cursor().job(), " epoch ", resume.cursor().epoch());
  for (const auto& [id, lease] : job->leases) {
    if (!leases_.Remove(id).ok()) continue;
    RevokeLocked(lease.holder, id, why, fx);
  }
  JournalRecord record;
  *record.mutable_job_resumed() = resume;
  RETURN_IF_ERROR(CommitLocked(std::move(record), fx));
  // Sessions open before the resume belong to the run before the restart:
  // end them (FAILED_PRECONDITION, so a surviving Reader stops instead of
  // competing for the restored work).
  for (int64_t id : sessions_.OpenIds(hello.job(), /*wanting=*/false)) {
    if (Session* other = sessions_.Find(id); other != nullptr) {
      FinishSessionLocked(
          *other,
          absl::FailedPreconditionError(absl::StrCat(
              why, " (attempt \"", hello.resume_attempt(),
              "\"); this session belongs to the run before that restart")),
          fx);
    }
  }
  RebuildQueuesLocked(hello.job());
  job = state_.FindJob(hello.job());
  std::string counts;
  for (int64_t n : job->consumed_per_slot)
    absl::StrAppend(&counts, counts.empty() ? "" : ",", n);
  LogInfo(
      "%s: now epoch %d, consumed per reader [%s] of %d per rank, world_size "
      "%d, %d reader(s) "
      "per rank",
      why, job->epoch, counts, job->plan.samples_per_rank,
      job->spec.world_size(), job->plan.workers_per_rank);
  if (options_.metrics != nullptr)
    options_.metrics->ForJob(hello.job()).resumes->Increment();
  MaybeAdvanceEpochLocked(hello.job(), fx);
  return absl::OkStatus();
}

void CoordinatorService::RefreshTokensLocked(Session& s, Effects& fx) {
  if (options_.lease_secret.empty()) return;
  const JobData* job = state_.FindJob(s.job);
  if (job == nullptr) return;
  const absl::Time now = options_.clock->Now();
  const absl::Duration ttl = TtlLocked(*job);
  for (const LeaseEntry* lease : leases_.HeldBy(s.trainer_id)) {
    if (lease->token_expires_at - now >= ttl / 2) continue;
    CoordinatorMessage grant;
    *grant.mutable_grant()->mutable_lease() = LeaseToProtoLocked(*lease, *job);
    fx.sends.emplace_back(s.sink, std::move(grant));
  }
}

void CoordinatorService::PlanForHello(const v1::Hello& hello) {
  absl::MutexLock one_at_a_time(&hello_plan_mu_);
  std::optional<PlanInputs> inputs;
  uint64_t serial = 0;
  bool per_rank = false;
  {
    ServiceLock lock(this);
    inputs = HelloPlanInputsLocked(hello);  // none if planned meanwhile
    if (!inputs.has_value()) return;
    const JobData* job = state_.FindJob(hello.job());
    per_rank =
        job->spec.mode() == v1::MODE_STATIC && job->spec.world_size() > 0;
    serial = next_plan_serial_++;
  }
  PlannedAhead planned = PlanAhead(*inputs, per_rank, serial);
  ServiceLock lock(this);
  OfferPlannedLocked(hello.job(), std::move(planned));
}

std::optional<PlanInputs> CoordinatorService::HelloPlanInputsLocked(
    const v1::Hello& hello) {
  // A resume plans from its cursor; an invalid Hello is refused unplanned.
  if (hello.has_cursor() || hello.num_workers() < 0 ||
      hello.num_workers() > kMaxWorkersPerRank)
    return std::nullopt;
  const JobData* job = state_.FindJob(hello.job());
  const int32_t workers = std::max(hello.num_workers(), 1);
  if (job == nullptr || job->done || job->plan.workers_per_rank == workers ||
      !job->leases.empty() || job->consumed_total > 0 ||
      static_cast<int64_t>(workers) * std::max(job->spec.world_size(), 1) >
          kMaxReadersPerJob)
    return std::nullopt;
  PlanOptions options = job->options;
  options.workers_per_rank = workers;
  if (state_.HasOfferedPlan(hello.job(), options, job->epoch))
    return std::nullopt;
  return job->InputsFor(options, job->epoch);
}

absl::Status CoordinatorService::UseWorkersLocked(const v1::Hello& hello,
                                                  Effects& fx) {
  const JobData* job = state_.FindJob(hello.job());
  const int32_t workers = std::max(hello.num_workers(), 1);
  if (job->done || job->plan.workers_per_rank == workers)
    return absl::OkStatus();
  if (!job->leases.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hello.num_workers=", hello.num_workers(), ": job ", hello.job(),
        " epoch ", job->epoch, " is being read with ",
        job->plan.workers_per_rank,
        " reader(s) per rank (DataLoader num_workers) and has leases out; "
        "every reader of a job "
        "must use the same number (it can change once no lease is out)"));
  }
  JournalRecord record;
  record.mutable_workers_set()->set_job(hello.job());
  record.mutable_workers_set()->set_epoch(job->epoch);
  record.mutable_workers_set()->set_workers_per_rank(workers);
  RETURN_IF_ERROR(CommitLocked(std::move(record), fx));
  RebuildQueuesLocked(hello.job());
  job = state_.FindJob(hello.job());
  LogInfo(
      "job %s: epoch %d planned for %d reader(s) per rank (%d samples per rank "
      "left)",
      hello.job(), job->epoch, workers, job->plan.samples_per_rank);
  // Sessions that said another number read slots that no longer exist.
  for (int64_t id : sessions_.OpenIds(hello.job(), /*wanting=*/false)) {
    Session* other = sessions_.Find(id);
    if (other != nullptr && other->num_workers != workers) {
      FinishSessionLocked(
          *other,
          absl::FailedPreconditionError(
              absl::StrCat("job ", hello.job(), " is now read with ", workers,
                           " reader(s) per rank (a session said num_workers=",
                           hello.num_workers(), "); this session said ",
                           other->num_workers)),
          fx);
    }
  }
  return absl::OkStatus();
}

absl::Status CoordinatorService::RecordInputWaitLocked(const Session& s,
                                                       const v1::InputWait& w) {
  const size_t buckets = CoordinatorMetrics::kInputWaitBounds.size() + 1;
  if (static_cast<size_t>(w.bucket_counts_size()) > buckets) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat.input_wait.bucket_counts has ", w.bucket_counts_size(),
        " entries; the protocol has ", buckets, " buckets"));
  }
  // A bound far above any real report: a trainer heartbeats every few
  // seconds, observing at most one wait per sample.
  constexpr uint64_t kMaxCount = uint64_t{1} << 40;
  uint64_t count = 0;
  for (uint64_t c : w.bucket_counts()) {
    if (c > kMaxCount || count + c > kMaxCount) {
      return absl::InvalidArgumentError(
          "heartbeat.input_wait.bucket_counts: more than 2^40 observations");
    }
    count += c;
  }
  if (!std::isfinite(w.sum_seconds()) || w.sum_seconds() < 0 ||
      w.sum_seconds() > 1e9) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat.input_wait.sum_seconds must be a finite number of seconds "
        ">= 0 (got ",
        w.sum_seconds(), ")"));
  }
  if (count == 0 && w.sum_seconds() == 0) return absl::OkStatus();
  runtime_[s.job].input_wait_by_rank[s.rank] += w.sum_seconds();
  PoolSizingLocked(s.pool).wait_seconds += w.sum_seconds();
  if (options_.metrics != nullptr) {
    std::vector<double> increments(buckets, 0);
    for (int i = 0; i < w.bucket_counts_size(); ++i) {
      increments[i] = static_cast<double>(w.bucket_counts(i));
    }
    options_.metrics->ForJob(s.job).input_wait->ObserveMultiple(
        increments, w.sum_seconds());
  }
  return absl::OkStatus();
}

absl::Status CoordinatorService::HandleLeaseMessageLocked(
    Session& s, const v1::TrainerMessage& m, Effects& fx) {
  switch (m.msg_case()) {
    case v1::TrainerMessage::kWant:
      if (m.want().credits() < 0) {
        return absl::InvalidArgumentError("want.credits must be >= 0");
      }
      s.credits = m.want().credits();
      PumpLocked(s.job, fx, PumpScope::kOne, &s);
      return absl::OkStatus();
    case v1::TrainerMessage::kHeartbeat:
      // The renewal above, and the consumer's input wait when reported.
      if (!m.heartbeat().has_input_wait()) return absl::OkStatus();
      return RecordInputWaitLocked(s, m.heartbeat().input_wait());
    case v1::TrainerMessage::kSync: {
      if (m.sync().has_input_wait()) {
        RETURN_IF_ERROR(RecordInputWaitLocked(s, m.sync().input_wait()));
      }
      // Messages of one stream are handled in order, each made durable
      // before the next is read: everything before this Sync already is.
      CoordinatorMessage synced;
      synced.mutable_synced()->set_id(m.sync().id());
      fx.sends.emplace_back(s.sink, std::move(synced));
      return absl::OkStatus();
    }
    case v1::TrainerMessage::kProgress:
    case v1::TrainerMessage::kComplete:
    case v1::TrainerMessage::kRelease:
    case v1::TrainerMessage::kReroute: {
      const v1::LeaseRef* ref = nullptr;
      int64_t consumed = -1;
      if (m.has_progress()) {
        ref = &m.progress().lease(), consumed = m.progress().consumed();
      } else if (m.has_complete()) {
        ref = &m.complete().lease();
      } else if (m.has_release()) {
        ref = &m.release().lease(), consumed = m.release().consumed();
      } else {
        ref = &m.reroute().lease(), consumed = m.reroute().consumed();
      }
      const std::string& lease_id = ref->lease_id();
      const uint64_t fence = ref->fence();
      if (lease_id.size() > kMaxIdBytes) {
        fx.sends.emplace_back(
            s.sink, Rejected("", Invalid("lease.lease_id",
                                         absl::StrCat(lease_id.size(),
                                                      " bytes; no lease id is "
                                                      "longer than ",
                                                      kMaxIdBytes))));
        return absl::OkStatus();
      }
      absl::StatusOr<const LeaseEntry*> found = leases_.Check(lease_id, fence);
      if (found.ok() && (*found)->holder != s.trainer_id) {
        found = absl::AbortedError(
            absl::StrCat("lease ", lease_id, " is held by another trainer"));
      }
      if (!found.ok()) {
        // Not fatal: the trainer drops the unit and carries on.
        fx.sends.emplace_back(s.sink, Rejected(lease_id, found.status()));
        return absl::OkStatus();
      }
      const LeaseEntry lease = **found;
      const int64_t size = lease.end - lease.begin;
      const bool complete = m.has_complete();
      if (complete) consumed = size;
      // The lease's epoch may have ended already: a Progress reporting the
      // epoch's last samples ends it, so every sample of this lease was
      // acknowledged. Then there is nothing left to record: a Complete
      // just ends the lease, a Progress changes nothing.
      const JobData* lease_job = state_.FindJob(lease.job);
      const bool past_epoch =
          lease_job == nullptr || lease_job->epoch != lease.epoch;
      if (!past_epoch && (consumed < lease.consumed || consumed > size)) {
        fx.sends.emplace_back(
            s.sink,
            Rejected(lease_id,
                     absl::InvalidArgumentError(absl::StrCat(
                         "lease ", lease_id, ": consumed=", consumed,
                         " must be in [", lease.consumed, ", ", size, "]"))));
        return absl::OkStatus();
      }
      if (!past_epoch && (consumed > lease.consumed || complete)) {
        JournalRecord record;
        auto* ack = record.mutable_unit_acked();
        ack->set_job(lease.job);
        ack->set_epoch(lease.epoch);
        ack->set_rank(lease.rank);
        ack->set_worker(lease.worker);
        ack->set_sequence(lease.sequence);
        ack->set_shard_index(lease.shard_index);
        ack->set_begin(lease.begin + lease.consumed);
        ack->set_consumed(consumed - lease.consumed);
        ack->set_complete(complete);
        ack->set_fence(lease.fence);
        ack->set_lease_id(lease_id);
        RETURN_IF_ERROR(CommitLocked(std::move(record), fx));
        PoolSizingLocked(lease_job->spec.pool()).consumed +=
            consumed - lease.consumed;
        RETURN_IF_ERROR(leases_.SetProgress(lease_id, fence, consumed));
        // Samples read from the lease's server: this reader reaches it.
        if (!s.unreachable.empty()) s.unreachable.Reached(lease.data_server);
      }
      if (complete) {
        // Checked live above, under the same lock.
        if (auto removed = leases_.Remove(lease_id); !removed.ok()) {
          LogError("lease table out of step with the journal: %s",
                   removed.status().ToString());
        }
        CountCompletedLocked(lease.job);
      } else if (m.has_release() || m.has_reroute()) {
        if (m.has_reroute() && !m.reroute().failed_data_server().empty()) {
          data_servers_.MarkSuspect(m.reroute().failed_data_server());
          s.unreachable.Failed(m.reroute().failed_data_server(),
                               options_.clock->Now());
        }
        EndLeaseLocked(lease.job, lease_id,
                       m.has_release() ? v1::internal::LEASE_END_RELEASED
                                       : v1::internal::LEASE_END_REROUTED,
                       fx);
      }
      // Only a new epoch (for every session) or returned work (for those
      // wanting more) concerns the other sessions; a Complete or Progress
      // frees (at most) this session's credit.
      const bool advanced = MaybeAdvanceEpochLocked(s.job, fx);
      PumpLocked(s.job, fx,
                 advanced                             ? PumpScope::kAll
                 : m.has_release() || m.has_reroute() ? PumpScope::kWanting
                                                      : PumpScope::kOne,
                 &s);
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          "session: empty or unknown trainer message");
  }
}

void CoordinatorService::CountCompletedLocked(const std::string& job_name) {
  v1::LeaseCounts& counts = runtime_[job_name].lease_counts;
  counts.set_completed(counts.completed() + 1);
  if (options_.metrics)
    options_.metrics->ForJob(job_name).completed->Increment();
}

void CoordinatorService::EndLeaseLocked(const std::string& job_name,
                                        const std::string& lease_id,
                                        v1::internal::LeaseEnd end,
                                        Effects& fx) {
  absl::StatusOr<LeaseEntry> lease = leases_.Remove(lease_id);
  if (!lease.ok()) return;
  NoteHolderWantsLocked(lease->holder);
  JournalRecord record;
  record.mutable_lease_ended()->set_job(job_name);
  record.mutable_lease_ended()->set_lease_id(lease_id);
  record.mutable_lease_ended()->set_reason(end);
  if (!CommitLocked(std::move(record), fx).ok()) return;
  const JobData* job = state_.FindJob(job_name);
  if (job == nullptr || job->epoch != lease->epoch) return;
  // The unconsumed remainder goes back to the front of its queue.
  if (lease->remaining() > 0) {
    const int32_t slot = job->plan.SlotOf(lease->rank, lease->worker);
    Piece piece{
        lease->sequence, lease->shard_index, lease->begin + lease->consumed,
        lease->end,      lease->rank,        slot};
    if (end == v1::internal::LEASE_END_EXPIRED) piece.returned_to = slot;
    queues_.Return(*job, slot, piece);
  }
  v1::LeaseCounts& counts = runtime_[job_name].lease_counts;
  if (end == v1::internal::LEASE_END_EXPIRED) {
    counts.set_expired(counts.expired() + 1);
  } else {
    counts.set_returned(counts.returned() + 1);
  }
  if (options_.metrics) {
    const CoordinatorMetrics::Job& m = options_.metrics->ForJob(job_name);
    (end == v1::internal::LEASE_END_EXPIRED ? m.expired : m.released)
        ->Increment();
  }
}

void CoordinatorService::RevokeLocked(const std::string& holder,
                                      const std::string& lease_id,
                                      const std::string& why, Effects& fx) {
  Session* session = sessions_.SessionOf(holder);
  if (session == nullptr) return;
  CoordinatorMessage revoke;
  revoke.mutable_revoke()->set_lease_id(lease_id);
  revoke.mutable_revoke()->set_why(why);
  fx.sends.emplace_back(session->sink, std::move(revoke));
}

// Grants: the queues' rebuilds and plans made ahead, pumping sessions
// with the Granter's grants, epoch advance.

void CoordinatorService::RebuildQueuesLocked(const std::string& name) {
  const JobData* job = state_.FindJob(name);
  if (job == nullptr) {
    queues_.Erase(name);
    runtime_.erase(name);
    return;
  }
  queues_.Rebuild(
      *job, [&] { return state_.PendingPieces(*job); },
      [&](uint64_t serial) { return state_.HasOfferedSerial(name, serial); });
  PlanNextEpochAheadLocked(name, *job, runtime_[name]);
}

void CoordinatorService::PlanNextEpochAheadLocked(const std::string& name,
                                                  const JobData& job,
                                                  JobRuntime& rt) {
  // The epoch after the last is planned too: a finished job reports its
  // quotas from it.
  const int64_t next = job.epoch + 1;
  if (job.done || (job.spec.num_epochs() > 0 && next > job.spec.num_epochs()))
    return;
  if (rt.ahead_epoch == next && rt.ahead_options == job.options) return;
  if (state_.HasOfferedPlan(name, job.options, next)) return;
  rt.ahead_epoch = next;
  rt.ahead_options = job.options;
  const bool per_rank =
      job.spec.mode() == v1::MODE_STATIC && job.spec.world_size() > 0;
  planner_->Schedule([this, name, per_rank,
                      inputs = job.InputsFor(job.options, next),
                      serial = next_plan_serial_++] {
    PlannedAhead planned = PlanAhead(inputs, per_rank, serial);
    ServiceLock lock(this);
    OfferPlannedLocked(name, std::move(planned));
  });
}

void CoordinatorService::OfferPlannedLocked(const std::string& name,
                                            PlannedAhead planned) {
  const JobData* job = state_.FindJob(name);
  if (job == nullptr || planned.prepared.epoch < job->epoch) return;
  const uint64_t serial = planned.prepared.serial;
  state_.OfferPlan(name, std::move(planned.prepared));
  // The state keeps a few offers per job: the queues of those it let go of
  // go too.
  queues_.Offer(name, serial, std::move(planned.queues), [&](uint64_t offered) {
    return state_.HasOfferedSerial(name, offered);
  });
}

bool CoordinatorService::SlotHasOpenSessionLocked(const JobData& job,
                                                  int32_t slot) {
  return sessions_.SlotHasOpenSession(job.spec.name(), slot);
}

bool CoordinatorService::SlotKeepsRemaindersLocked(const JobData& job,
                                                   const JobRuntime& rt,
                                                   int32_t slot) {
  if (SlotHasOpenSessionLocked(job, slot)) return true;
  auto left = rt.slot_left_at.find(slot);
  return left != rt.slot_left_at.end() &&
         options_.clock->Now() < left->second + kReconnectGrace;
}

void CoordinatorService::PumpAllLocked(Effects& fx) {
  for (const auto& [name, job] : state_.jobs())
    PumpLocked(name, fx, PumpScope::kWanting);
}

void CoordinatorService::NoteHolderWantsLocked(const std::string& holder) {
  if (Session* s = sessions_.SessionOf(holder); s != nullptr) {
    sessions_.SetWanting(*s, true);
  }
}

bool CoordinatorService::MaybeAdvanceEpochLocked(const std::string& name,
                                                 Effects& fx) {
  const JobData* job = state_.FindJob(name);
  if (job == nullptr || job->done || !job->epoch_complete()) return false;
  JournalRecord record;
  record.mutable_epoch_advanced()->set_job(name);
  record.mutable_epoch_advanced()->set_epoch(job->epoch + 1);
  if (!CommitLocked(std::move(record), fx).ok()) return false;
  RebuildQueuesLocked(name);
  LogInfo("job %s: epoch %d complete", name, job->epoch - 1);
  return true;
}

bool CoordinatorService::GrantOneLocked(Session& s, const JobData& job,
                                        JobRuntime& rt, Effects& fx,
                                        std::string* why_not,
                                        v1::WaitingKind* why_kind) {
  // Read once: heartbeats raise the floor without the state lock.
  std::variant<Granter::Grant, Granter::Wait> next = granter_.Next(
      s, job, seen_fence_floor_.load(),
      [&](int32_t slot) { return SlotKeepsRemaindersLocked(job, rt, slot); });
  if (const auto* wait = std::get_if<Granter::Wait>(&next)) {
    if (!wait->reason.empty()) {
      *why_kind = wait->kind;
      *why_not = wait->reason;
    }
    return false;
  }
  Granter::Grant& grant = std::get<Granter::Grant>(next);
  const std::string lease_id = grant.record.lease_granted().lease_id();
  const int64_t samples = grant.piece.size();
  if (!CommitLocked(std::move(grant.record), fx).ok()) return false;
  LeaseEntry entry = LiveLease(job.leases.at(lease_id), job);
  entry.data_server = std::move(grant.data_server);
  if (absl::Status added = leases_.Add(std::move(entry), TtlLocked(job));
      !added.ok()) {
    // Lease ids carry their fence, which only grows: a clash is a bug.
    LogError("lease table out of step with the journal: %s", added.ToString());
  }
  CoordinatorMessage message;
  *message.mutable_grant()->mutable_lease() =
      LeaseToProtoLocked(*leases_.Find(lease_id), job);
  fx.sends.emplace_back(s.sink, std::move(message));
  v1::LeaseCounts& counts = runtime_[job.spec.name()].lease_counts;
  counts.set_granted(counts.granted() + 1);
  if (s.node.empty()) {
    counts.set_samples_unknown_node(counts.samples_unknown_node() + samples);
  } else if (grant.same_node) {
    counts.set_samples_same_node(counts.samples_same_node() + samples);
  } else {
    counts.set_samples_other_node(counts.samples_other_node() + samples);
  }
  if (options_.metrics) {
    const CoordinatorMetrics::Job& m =
        options_.metrics->ForJob(job.spec.name());
    m.granted->Increment();
    (s.node.empty()    ? m.granted_unknown_node
     : grant.same_node ? m.granted_same_node
                       : m.granted_other_node)
        ->Increment(static_cast<double>(samples));
  }
  granter_.Hints(job, job.plan.SlotOf(s.rank, s.worker), fx);
  return true;
}

void CoordinatorService::PumpLocked(const std::string& name, Effects& fx,
                                    PumpScope scope, Session* only) {
  const JobData* job = state_.FindJob(name);
  if (job == nullptr) return;
  JobRuntime& rt = runtime_[name];
  // The sessions to visit (copied: a session may finish on the way).
  std::vector<int64_t> ids;
  if (scope != PumpScope::kOne) {
    ids = sessions_.OpenIds(name, /*wanting=*/scope == PumpScope::kWanting);
  }
  if (only != nullptr && scope != PumpScope::kAll &&
      std::find(ids.begin(), ids.end(), only->id) == ids.end()) {
    ids.push_back(only->id);
  }
  for (int64_t id : ids) {
    Session* found = sessions_.Find(id);
    if (found == nullptr) continue;
    Session& s = *found;
    if (!s.hello || s.finished || s.job != name) continue;
    if (s.announced_epoch != job->epoch) {
      if (s.announced_epoch >= 0) {
        CoordinatorMessage end;
        end.mutable_epoch_end()->set_epoch(job->epoch - 1);
        fx.sends.emplace_back(s.sink, std::move(end));
      }
      s.announced_epoch = job->epoch;
      if (job->done) {
        // Leases whose samples a Progress acknowledged in full end with the
        // job; their Complete can no longer arrive on a finished session.
        std::vector<std::string> held;
        for (const LeaseEntry* l : leases_.HeldBy(s.trainer_id)) {
          if (l->job == name) held.push_back(l->lease_id);
        }
        for (const std::string& id : held) {
          if (leases_.Remove(id).ok()) CountCompletedLocked(name);
        }
        CoordinatorMessage done;
        done.mutable_job_done()->set_num_epochs(job->spec.num_epochs());
        done.mutable_job_done()->set_message(JobDoneMessage(*job));
        fx.sends.emplace_back(s.sink, std::move(done));
        FinishSessionLocked(s, absl::OkStatus(), fx);
        continue;
      }
      CoordinatorMessage begin;
      begin.mutable_epoch_begin()->set_epoch(job->epoch);
      const int32_t slot = job->plan.SlotOf(s.rank, s.worker);
      begin.mutable_epoch_begin()->set_samples_for_rank(
          job->plan.samples_per_rank);
      begin.mutable_epoch_begin()->set_already_consumed(
          job->consumed_by_rank(s.rank));
      begin.mutable_epoch_begin()->set_samples_for_worker(
          job->plan.slot_quota(slot));
      begin.mutable_epoch_begin()->set_already_consumed_by_worker(
          job->consumed_per_slot[slot]);
      fx.sends.emplace_back(s.sink, begin);
    }
    if (job->done) continue;
    int32_t held = static_cast<int32_t>(leases_.CountHeldBy(s.trainer_id));
    std::string why_not;
    v1::WaitingKind why_kind = v1::WAITING_KIND_UNSPECIFIED;
    if (options_.wait_for_data_servers &&
        !data_servers_.AnyLiveIn(job->spec.pool())) {
      // A grant must name a server to read from: the units wait.
      why_not =
          job->spec.pool().empty()
              ? std::string(
                    "no live data server: units wait until one "
                    "registers with the coordinator")
              : absl::StrCat("no live data server of pool ", job->spec.pool(),
                             ": units wait until one registers with the "
                             "coordinator (sluice-dataserver --pool=",
                             job->spec.pool(), ")");
      why_kind = v1::WAITING_NO_DATA_SERVER;
    } else {
      const int32_t before = held;
      while (held < s.credits &&
             GrantOneLocked(s, *job, rt, fx, &why_not, &why_kind))
        ++held;
      // Told again after being fed: a trainer may wait for "nothing left" to
      // end its part of the epoch.
      if (held > before) s.waiting.clear();
    }
    if (held < s.credits && !why_not.empty() && why_not != s.waiting) {
      s.waiting = why_not;
      CoordinatorMessage waiting;
      waiting.mutable_waiting()->set_reason(why_not);
      waiting.mutable_waiting()->set_kind(why_kind);
      fx.sends.emplace_back(s.sink, waiting);
    } else if (held >= s.credits) {
      s.waiting.clear();
    }
    // A session that finished on the way is no longer open: left alone.
    sessions_.SetWanting(s, held < s.credits);
  }
}

}  // namespace sluice
