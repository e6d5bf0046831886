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

using coordinator_internal::kMaxFenceSeen;
using coordinator_internal::LiveLease;

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

void CoordinatorService::DeleteJob(const std::string& name, StatusReply done) {
  absl::Status refused;
  {
    ServiceLock lock(this);
    const JobData* job = state_.FindJob(name);
    if (job == nullptr) {
      refused = absl::NotFoundError(
          absl::StrCat("job ", QuotePrefix(name), " not found"));
    } else {
      for (const auto& [id, lease] : job->leases) {
        if (auto removed = leases_.Remove(id); !removed.ok()) {
          LogError("lease table out of step with the journal: %s",
                   removed.status().ToString());
        }
      }
      Effects fx;
      JournalRecord record;
      record.mutable_job_deleted()->set_job(name);
      refused = CommitLocked(std::move(record), fx);
      if (refused.ok()) {
        queues_.Erase(name);
        runtime_.erase(name);
        for (int64_t id : sessions_.OpenIds(name, /*wanting=*/false)) {
          FinishSessionLocked(
              *sessions_.Find(id),
              absl::NotFoundError(absl::StrCat("job ", name, " was deleted")),
              fx);
        }
        if (options_.metrics != nullptr) options_.metrics->RemoveJob(name);
        UpdateGaugesLocked();
        fx.replies.push_back(done);
        SubmitLocked(fx);
      }
    }
  }
  if (!refused.ok()) return done(refused);
  DeliverReady();
}

absl::Status CoordinatorService::DeleteJob(const std::string& name) {
  return AwaitReply<absl::Status>(
      [&](StatusReply done) { DeleteJob(name, std::move(done)); });
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

}  // namespace sluice
