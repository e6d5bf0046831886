#include "server/coordinator/coordinator_service.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/common/lease_token.h"
#include "server/common/logging.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace sluice {
namespace {

using v1::CoordinatorMessage;
using v1::internal::JournalRecord;

// What a reader of a finished job is told.
std::string JobDoneMessage(const JobData& job) {
  return absl::StrCat(
      "job \"", job.spec.name(), "\" is done: all ", job.spec.num_epochs(),
      " epochs were consumed; create a new job or resume from a cursor");
}

// Ids a trainer names (trainer_id, lease_id): longer ones are refused
// without being quoted.
constexpr size_t kMaxIdBytes = 256;

// A data server's routing weight (a larger one would take every grant).
constexpr int32_t kMaxDataServerCapacity = 1024;

// Readers per rank a Hello may name (DataLoader workers).
constexpr int32_t kMaxWorkersPerRank = 1024;
// Slots (rank x worker) per job: each holds counts and an acknowledgement log.
constexpr int64_t kMaxReadersPerJob = 1 << 20;

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

CoordinatorMessage Rejected(const std::string& lease_id,
                            const absl::Status& s) {
  CoordinatorMessage m;
  m.mutable_rejected()->set_lease_id(lease_id);
  m.mutable_rejected()->set_code(s.raw_code());
  m.mutable_rejected()->set_message(std::string(s.message()));
  return m;
}

// The live-table form of a lease from its durable record.
LeaseEntry LiveLease(const DurableLease& d, const std::string& job,
                     int64_t epoch) {
  LeaseEntry lease;
  lease.lease_id = d.lease_id;
  lease.fence = d.fence;
  lease.job = job;
  lease.epoch = epoch;
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

}  // namespace

CoordinatorService::CoordinatorService(const CoordinatorOptions& options)
    : options_(options),
      leases_(options.clock),
      data_servers_(options.clock, 3 * options.heartbeat_interval) {}

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(
    const CoordinatorOptions& options) {
  std::unique_ptr<CoordinatorService> service(new CoordinatorService(options));
  if (!options.manifest_roots.empty()) {
    ASSIGN_OR_RETURN(PathRoots roots, PathRoots::Create(options.manifest_roots,
                                                        "--manifest_roots"));
    service->manifest_roots_.emplace(std::move(roots));
  }
  absl::MutexLock lock(&service->mu_);
  if (options.etcd_journal.has_value()) {
    EtcdJournalOptions etcd = *options.etcd_journal;
    if (options.metrics != nullptr && !etcd.on_commit) {
      etcd.on_commit = [m = options.metrics](double s) {
        m->fsync_latency.Observe(s);
        m->etcd_request_latency.Observe(s);
      };
    }
    CoordinatorState* state = &service->state_;
    ASSIGN_OR_RETURN(
        std::unique_ptr<EtcdJournal> journal,
        EtcdJournal::Open(
            std::move(etcd),
            [state](const JournalRecord& r)
                ABSL_NO_THREAD_SAFETY_ANALYSIS { return state->Apply(r); },
            // The leader compacted while this one waited as a standby.
            [state]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
              *state = CoordinatorState();
            }));
    service->recovered_records_ = journal->replayed_records();
    service->last_snapshot_bytes_ = journal->bytes_written();
    service->journal_ = std::move(journal);
  } else if (options.journal_dir.empty()) {
    service->journal_ = std::make_unique<MemoryJournal>();
  } else {
    FsyncObserver observer;
    if (options.metrics != nullptr) {
      observer = [m = options.metrics](double s) {
        m->fsync_latency.Observe(s);
      };
    }
    CoordinatorState* state = &service->state_;
    ASSIGN_OR_RETURN(
        std::unique_ptr<FileJournal> journal,
        FileJournal::Open(
            options.journal_dir, /*create=*/true,
            [state](const JournalRecord& r)
                ABSL_NO_THREAD_SAFETY_ANALYSIS { return state->Apply(r); },
            std::move(observer)));
    service->recovered_records_ = journal->replayed_records();
    // The next compaction waits until the journal has doubled.
    service->last_snapshot_bytes_ = journal->bytes_written();
    service->journal_ = std::move(journal);
  }
  // Recovered leases get a fresh TTL (as etcd does): their holders may be
  // reconnecting right now.
  for (const auto& [name, job] : service->state_.jobs()) {
    service->RebuildQueuesLocked(name);
    for (const auto& [id, d] : job.leases) {
      RETURN_IF_ERROR(service->leases_.Add(LiveLease(d, name, job.epoch),
                                           service->TtlLocked(job)));
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
  return service;
}

absl::Duration CoordinatorService::TtlLocked(const JobData& job) const {
  return job.spec.lease_ttl_ms() > 0
             ? absl::Milliseconds(job.spec.lease_ttl_ms())
             : options_.default_lease_ttl;
}

absl::Status CoordinatorService::CommitLocked(JournalRecord record,
                                              Effects& fx) {
  record.set_time_unix_ms(absl::ToUnixMillis(options_.clock->Now()));
  fx.ticket = journal_->Enqueue(record);
  RETURN_IF_ERROR(state_.Apply(std::move(record)));
  MaybeCompactLocked();
  return absl::OkStatus();
}

void CoordinatorService::MaybeCompactLocked() {
  const int64_t size = journal_->bytes_written();
  if (options_.journal_compact_bytes <= 0 ||
      size < options_.journal_compact_bytes ||
      size < 2 * last_snapshot_bytes_) {
    return;
  }
  const absl::Time start = absl::Now();
  const JournalRecord snapshot = [&] {
    JournalRecord r = state_.Snapshot();
    r.set_time_unix_ms(absl::ToUnixMillis(options_.clock->Now()));
    return r;
  }();
  absl::Status status = journal_->Compact(snapshot);
  if (!status.ok()) {
    // Not fatal: the journal keeps growing and compaction is retried later.
    LogWarning("journal compaction failed (the journal is unchanged): %s",
               status.message());
    last_snapshot_bytes_ = size;
    return;
  }
  last_snapshot_bytes_ = journal_->bytes_written();
  LogInfo("journal compacted: %d -> %d bytes in %s", size, last_snapshot_bytes_,
          absl::FormatDuration(absl::Now() - start));
  if (options_.metrics != nullptr) options_.metrics->compactions.Increment();
}

void CoordinatorService::Flush() { outbox_->Flush(); }

CoordinatorService::~CoordinatorService() {
  // Whatever is left goes out once durable, before the journal closes.
  outbox_.reset();
}

void CoordinatorService::RebuildQueuesLocked(const std::string& name) {
  const JobData* job = state_.FindJob(name);
  if (job == nullptr) {
    runtime_.erase(name);
    return;
  }
  JobRuntime& rt = runtime_[name];
  const bool per_rank =
      job->spec.mode() == v1::MODE_STATIC && job->spec.world_size() > 0;
  rt.queues.assign(per_rank ? job->plan.num_slots() : 1, {});
  for (const Piece& p : state_.PendingPieces(*job)) {
    rt.queues[per_rank ? p.slot : 0].push_back(p);
  }
}

std::deque<Piece>& CoordinatorService::QueueForLocked(const JobData& job,
                                                      JobRuntime& rt,
                                                      int32_t slot) {
  const bool per_rank =
      job.spec.mode() == v1::MODE_STATIC && job.spec.world_size() > 0;
  return rt.queues[per_rank ? slot : 0];
}

absl::StatusOr<v1::Job> CoordinatorService::CreateJob(
    const v1::JobSpec& request) {
  ASSIGN_OR_RETURN(
      v1::JobSpec spec,
      NormalizeJobSpec(
          request,
          ManifestFiles{manifest_roots_ ? &*manifest_roots_ : nullptr,
                        options_.max_manifest_bytes},
          options_.job_limits));
  Effects fx;
  uint64_t ticket = 0;
  v1::Job result;
  {
    absl::MutexLock lock(&mu_);
    if (const JobData* existing = state_.FindJob(spec.name())) {
      if (!google::protobuf::util::MessageDifferencer::Equals(existing->spec,
                                                              spec)) {
        return absl::AlreadyExistsError(
            absl::StrCat("job ", spec.name(), " exists with a different spec"));
      }
      return JobToProtoLocked(*existing, false);
    }
    const std::string name = spec.name();
    JournalRecord record;
    *record.mutable_job_created()->mutable_spec() =
        std::move(spec);  // moved, not copied
    RETURN_IF_ERROR(CommitLocked(std::move(record), fx));
    RebuildQueuesLocked(name);
    result = JobToProtoLocked(*state_.FindJob(name), false);
    UpdateGaugesLocked();
    ticket = fx.ticket;
    SubmitLocked(fx);
  }
  // The reply depends on the record: it waits until the record is durable.
  absl::Status durable = journal_->WaitDurable(ticket);
  DeliverReady();
  RETURN_IF_ERROR(durable);
  LogInfo("created job %s: %d shards, %d samples/epoch, world_size %d",
          result.spec().name(), result.status().num_shards(),
          result.status().samples_per_epoch(), result.spec().world_size());
  return result;
}

absl::StatusOr<v1::Job> CoordinatorService::GetJob(const std::string& name,
                                                   bool include_manifest) {
  absl::MutexLock lock(&mu_);
  const JobData* job = state_.FindJob(name);
  if (job == nullptr)
    return absl::NotFoundError(
        absl::StrCat("job ", QuotePrefix(name), " not found"));
  return JobToProtoLocked(*job, include_manifest);
}

std::vector<v1::Job> CoordinatorService::ListJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> jobs;
  for (const auto& [name, job] : state_.jobs())
    jobs.push_back(JobToProtoLocked(job, false));
  return jobs;
}

absl::Status CoordinatorService::DeleteJob(const std::string& name) {
  Effects fx;
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    const JobData* job = state_.FindJob(name);
    if (job == nullptr)
      return absl::NotFoundError(
          absl::StrCat("job ", QuotePrefix(name), " not found"));
    for (const auto& [id, lease] : job->leases)
      leases_.Remove(id).IgnoreError();
    JournalRecord record;
    record.mutable_job_deleted()->set_job(name);
    RETURN_IF_ERROR(CommitLocked(std::move(record), fx));
    runtime_.erase(name);
    for (auto& [id, s] : sessions_) {
      if (s.hello && s.job == name) {
        FinishSessionLocked(
            s, absl::NotFoundError(absl::StrCat("job ", name, " was deleted")),
            fx);
      }
    }
    if (options_.metrics != nullptr) options_.metrics->RemoveJob(name);
    UpdateGaugesLocked();
    ticket = fx.ticket;
    SubmitLocked(fx);
  }
  absl::Status durable = journal_->WaitDurable(ticket);
  DeliverReady();
  RETURN_IF_ERROR(durable);
  return absl::OkStatus();
}

v1::Job CoordinatorService::JobToProtoLocked(const JobData& job,
                                             bool include_manifest) {
  v1::Job out;
  if (include_manifest) {
    *out.mutable_spec() = job.spec;
  } else {
    // Copy everything but the (possibly million-shard) manifests: move
    // them aside for the copy (O(1) swaps; state_ is ours under mu_).
    v1::JobSpec& spec = const_cast<v1::JobSpec&>(job.spec);
    v1::Manifest manifest;
    std::vector<v1::Manifest> sources(static_cast<size_t>(spec.sources_size()));
    const bool inline_manifest = spec.has_manifest();
    if (inline_manifest) spec.mutable_manifest()->Swap(&manifest);
    for (int i = 0; i < spec.sources_size(); ++i)
      spec.mutable_sources(i)->mutable_manifest()->Swap(&sources[i]);
    *out.mutable_spec() = spec;
    if (inline_manifest) {
      out.mutable_spec()->clear_manifest();
      spec.mutable_manifest()->Swap(&manifest);
    }
    for (int i = 0; i < spec.sources_size(); ++i) {
      out.mutable_spec()->mutable_sources(i)->clear_manifest();
      spec.mutable_sources(i)->mutable_manifest()->Swap(&sources[i]);
    }
  }
  out.set_create_time_unix_ms(job.create_time_unix_ms);
  v1::JobStatus* st = out.mutable_status();
  for (std::string& address : data_servers_.LiveAddresses())
    st->add_live_data_servers(std::move(address));
  st->set_state(job.done ? v1::JOB_STATE_DONE
                         : (job.epoch == 0 && job.consumed_total == 0 &&
                                    job.leases.empty()
                                ? v1::JOB_STATE_PENDING
                                : v1::JOB_STATE_RUNNING));
  st->set_epoch(job.epoch);
  st->set_samples_per_epoch(job.served_per_epoch());
  st->set_samples_per_rank(job.plan.samples_per_rank);
  // A finished job's last epoch was consumed whole; its counters were reset
  // when the epoch ended.
  st->set_consumed_in_epoch(job.done ? job.served_per_epoch()
                                     : job.consumed_total);
  st->set_dropped_per_epoch(job.plan.dropped);
  st->set_total_samples(job.plan.total_samples);
  st->set_num_shards(static_cast<int32_t>(job.shard_samples.size()));
  if (job.mix != nullptr) {
    const std::vector<int64_t> counts = job.mix->EpochCounts(job.epoch);
    int32_t shards = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      const MixSourceShape& src = job.mix->sources()[i];
      const auto s = static_cast<int32_t>(i);
      shards += static_cast<int32_t>(src.shard_samples.size());
      v1::SourceStatus* ss = st->add_sources();
      ss->set_name(src.name);
      ss->set_samples_in_epoch(counts[i]);
      ss->set_consumed_in_epoch(job.done ? counts[i]
                                : job.consumed_per_source.size() > i
                                    ? job.consumed_per_source[i]
                                    : 0);
      const auto [pass, position] = job.mix->StreamPosition(s, job.epoch, 0);
      ss->set_pass(pass);
      ss->set_pass_position(position);
      ss->set_num_samples(src.num_samples());
      ss->set_stopped(src.stop && counts[i] < src.per_epoch);
    }
    st->set_num_shards(shards);
  }
  if (auto rt = runtime_.find(job.spec.name()); rt != runtime_.end()) {
    *st->mutable_leases() = rt->second.lease_counts;
  }
  for (int32_t r = 0; r < job.plan.num_ranks; ++r) {
    v1::RankStatus* rs = st->add_ranks();
    rs->set_rank(r);
    rs->set_consumed(job.done && job.plan.samples_per_rank > 0
                         ? job.plan.samples_per_rank
                         : job.consumed_by_rank(r));
    rs->set_quota(job.plan.samples_per_rank);
    int32_t live = 0;
    for (const auto& [id, l] : job.leases) live += l.rank == r;
    rs->set_live_leases(live);
    int32_t sessions = 0;
    for (const auto& [id, s] : sessions_) {
      sessions +=
          s.hello && !s.finished && s.job == job.spec.name() && s.rank == r;
    }
    rs->set_sessions(sessions);
    if (auto rt = runtime_.find(job.spec.name()); rt != runtime_.end()) {
      if (auto w = rt->second.input_wait_by_rank.find(r);
          w != rt->second.input_wait_by_rank.end()) {
        rs->set_input_wait_seconds(w->second);
      }
    }
  }
  return out;
}

v1::Lease CoordinatorService::LeaseToProtoLocked(const LeaseEntry& lease,
                                                 const JobData& job) {
  v1::Lease out;
  out.set_lease_id(lease.lease_id);
  out.set_fence(lease.fence);
  out.set_job(lease.job);
  out.set_epoch(lease.epoch);
  out.set_rank(job.spec.world_size() > 0 ? lease.rank : -1);
  v1::WorkUnit* unit = out.mutable_unit();
  unit->set_shard_index(lease.shard_index);
  if (job.mix != nullptr) {
    MixUnitToProto(*job.mix, job.spec, lease.epoch, lease.begin, lease.end,
                   unit);
  } else if (UsesWindows(job.options)) {
    const ShuffleWindow& window = WindowsLocked(job).at(lease.shard_index);
    unit->set_window_order(window.order_seed);
    for (int32_t index : window.shards)
      AddPiece(job.spec.manifest().shards(index), index, unit);
  } else {
    const v1::Shard& shard = job.spec.manifest().shards(lease.shard_index);
    unit->set_shard_url(shard.url());
    unit->set_shard_size_bytes(shard.size_bytes());
    unit->set_shard_checksum(shard.checksum());
  }
  unit->set_begin(lease.begin);
  unit->set_end(lease.end);
  unit->set_sequence(lease.sequence);
  out.set_data_server(lease.data_server);
  out.set_expires_at_unix_ms(absl::ToUnixMillis(lease.expires_at));
  out.set_on_corrupt(job.spec.on_corrupt());
  out.set_augment_seed(job.spec.seed());
  if (!options_.lease_secret.empty()) {
    out.set_token(SignLease(out, options_.lease_secret));
    leases_.SetTokenExpiry(lease.lease_id,
                           lease.expires_at);  // sent to the holder
  }
  return out;
}

absl::Status CoordinatorService::CheckRegistration(
    const v1::RegisterDataServer& r) const {
  // Who is asking first: an unauthenticated caller learns nothing more.
  if (!options_.lease_secret.empty()) {
    RETURN_IF_ERROR(
        VerifyRegistration(r.address(), r.credential(), options_.lease_secret));
  }
  if (r.address().empty() || r.address().size() > kMaxIdBytes ||
      r.address().find(':') == std::string::npos) {
    return Invalid(
        "register.address",
        absl::StrCat(QuotePrefix(r.address()), " is not host:port (at most ",
                     kMaxIdBytes, " bytes)"));
  }
  if (r.capacity() < 0 || r.capacity() > kMaxDataServerCapacity) {
    return Invalid("register.capacity",
                   absl::StrCat(r.capacity(), " is outside [0, ",
                                kMaxDataServerCapacity, "]"));
  }
  return absl::OkStatus();
}

int64_t CoordinatorService::RegisterDataServer(
    const std::string& address, int32_t capacity,
    std::shared_ptr<DataServerSink> sink, uint64_t max_fence_seen) {
  Effects fx;
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    seen_fence_floor_ = std::max(seen_fence_floor_, max_fence_seen + 1);
    const bool none_live = !data_servers_.AnyLive();
    if (sink != nullptr) {
      // Under mu_, so the reply precedes any hint for this server.
      v1::CoordinatorToDataServer reply;
      reply.mutable_registered()->set_heartbeat_interval_ms(
          absl::ToInt64Milliseconds(data_server_timeout() / 3));
      reply.mutable_registered()->set_heartbeat_timeout_ms(
          absl::ToInt64Milliseconds(data_server_timeout()));
      sink->Send(reply);
    }
    id = data_servers_.Add(address, capacity, std::move(sink));
    UpdateDataServerMetricLocked();
    if (none_live) PumpAllLocked(fx);  // units waiting for a data server
    SubmitLocked(fx);
  }
  DeliverReady();
  return id;
}

void CoordinatorService::PumpAllLocked(Effects& fx) {
  for (const auto& [name, job] : state_.jobs()) PumpLocked(name, fx);
}

void CoordinatorService::DataServerHeartbeat(int64_t id,
                                             uint64_t max_fence_seen) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    seen_fence_floor_ = std::max(seen_fence_floor_, max_fence_seen + 1);
    const bool none_live = !data_servers_.AnyLive();
    data_servers_.Heartbeat(id);
    UpdateDataServerMetricLocked();
    if (none_live && data_servers_.AnyLive()) PumpAllLocked(fx);
    SubmitLocked(fx);
  }
  DeliverReady();
}

void CoordinatorService::UnregisterDataServer(int64_t id) {
  absl::MutexLock lock(&mu_);
  data_servers_.Remove(id);
  UpdateDataServerMetricLocked();
}

std::vector<std::string> CoordinatorService::LiveDataServers() {
  absl::MutexLock lock(&mu_);
  return data_servers_.LiveAddresses();
}

absl::Status CoordinatorService::PersistOnceFinished(
    const v1::internal::OnceFinished& finished) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    JournalRecord record;
    *record.mutable_once_finished() = finished;
    RETURN_IF_ERROR(CommitLocked(std::move(record), fx));
  }
  return journal_->WaitDurable(fx.ticket);  // nothing to send
}

std::vector<v1::internal::OnceFinished> CoordinatorService::ListOnceFinished(
    const std::string& scope) {
  absl::MutexLock lock(&mu_);
  return state_.OnceFinishedIn(scope);
}

absl::Status CoordinatorService::ResetOnce(const std::string& scope,
                                           const std::string& name) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    if (state_.FindOnceFinished(scope, name) == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "once ", scope, "/", name, " has not finished: nothing to reset"));
    }
    JournalRecord record;
    record.mutable_once_reset()->set_scope(scope);
    record.mutable_once_reset()->set_name(name);
    RETURN_IF_ERROR(CommitLocked(std::move(record), fx));
  }
  return journal_->WaitDurable(fx.ticket);  // nothing to send
}

std::optional<v1::internal::OnceFinished> CoordinatorService::FindOnceFinished(
    const std::string& scope, const std::string& name) {
  absl::MutexLock lock(&mu_);
  const v1::internal::OnceFinished* f = state_.FindOnceFinished(scope, name);
  if (f == nullptr) return std::nullopt;
  return *f;
}

void CoordinatorService::UpdateDataServerMetricLocked() {
  if (options_.metrics == nullptr) return;
  options_.metrics->data_servers.Set(data_servers_.LiveCount());
}

int64_t CoordinatorService::OpenSession(std::shared_ptr<SessionSink> sink) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_session_id_++;
  Session& s = sessions_[id];
  s.id = id;
  s.sink = std::move(sink);
  UpdateGaugesLocked();
  return id;
}

void CoordinatorService::CloseSession(int64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  auto owner = session_of_trainer_.find(it->second.trainer_id);
  if (owner != session_of_trainer_.end() && owner->second == session_id) {
    session_of_trainer_.erase(owner);
  }
  if (it->second.hello && options_.metrics != nullptr &&
      state_.FindJob(it->second.job) != nullptr) {
    options_.metrics->ForJob(it->second.job).sessions->Decrement();
  }
  sessions_.erase(it);
  UpdateGaugesLocked();
}

void CoordinatorService::FinishSessionLocked(Session& s,
                                             const absl::Status& status,
                                             Effects& fx) {
  if (s.finished) return;
  s.finished = true;
  fx.finishes.emplace_back(s.sink, status);
}

void CoordinatorService::OnMessage(int64_t session_id,
                                   const v1::TrainerMessage& message) {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end() || it->second.finished) return;
    Session& s = it->second;
    if (message.has_hello()) {
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
    UpdateGaugesLocked();
    SubmitLocked(fx);
  }
  DeliverReady();
}

void CoordinatorService::HandleHelloLocked(Session& s, const v1::Hello& hello,
                                           Effects& fx) {
  if (hello.trainer_id().size() > kMaxIdBytes ||
      hello.resume_attempt().size() > kMaxIdBytes) {
    FinishSessionLocked(s,
                        Invalid("hello.trainer_id",
                                absl::StrCat("trainer_id and resume_attempt "
                                             "are limited to ",
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
  int64_t open_sessions = 0;
  for (const auto& [id, other] : sessions_) {
    open_sessions += other.hello && !other.finished && other.job == hello.job();
  }
  if (open_sessions >= options_.max_sessions_per_job) {
    FinishSessionLocked(
        s,
        absl::ResourceExhaustedError(absl::StrCat(
            "job ", hello.job(), " has ", open_sessions,
            " open sessions; the limit is ", options_.max_sessions_per_job)),
        fx);
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
  if (options_.metrics != nullptr)
    options_.metrics->ForJob(s.job).sessions->Increment();
  // Leases follow the trainer within its job: the same trainer_id in
  // another job (one process reading two jobs) is another holder.
  s.trainer_id =
      absl::StrCat(hello.job(), "/",
                   hello.trainer_id().empty() ? absl::StrCat("session-", s.id)
                                              : hello.trainer_id());
  // One live session per trainer: a reconnect replaces the old stream.
  auto [owner, inserted] = session_of_trainer_.emplace(s.trainer_id, s.id);
  if (!inserted && owner->second != s.id) {
    auto old = sessions_.find(owner->second);
    if (old != sessions_.end()) {
      FinishSessionLocked(
          old->second,
          absl::AbortedError(absl::StrCat("trainer ", s.trainer_id,
                                          " reconnected on a new session")),
          fx);
    }
    owner->second = s.id;
  }
  CoordinatorMessage welcome;
  welcome.mutable_welcome()->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(options_.heartbeat_interval));
  welcome.mutable_welcome()->set_lease_ttl_ms(
      absl::ToInt64Milliseconds(TtlLocked(*job)));
  welcome.mutable_welcome()->set_session_id(absl::StrCat(s.id));
  welcome.mutable_welcome()->set_world_size(ws);
  fx.sends.emplace_back(s.sink, std::move(welcome));
  // A reconnecting trainer keeps its leases: renew and re-announce them.
  leases_.RenewHolder(s.trainer_id, TtlLocked(*job));
  PumpLocked(s.job, fx);  // announces the epoch first
  for (const LeaseEntry* lease : leases_.HeldBy(s.trainer_id)) {
    CoordinatorMessage grant;
    *grant.mutable_grant()->mutable_lease() = LeaseToProtoLocked(*lease, *job);
    fx.sends.emplace_back(s.sink, std::move(grant));
  }
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
  const JobData* job = state_.FindJob(hello.job());
  if (job->last_resume.has_value() &&
      google::protobuf::util::MessageDifferencer::Equals(*job->last_resume,
                                                         resume)) {
    return absl::OkStatus();  // another rank of the same restart
  }
  RETURN_IF_ERROR(state_.CheckResume(resume));
  // Every live lease of the job belongs to the position being replaced.
  const std::string why =
      absl::StrCat("job ", hello.job(), " resumed from a cursor of job ",
                   resume.cursor().job(), " epoch ", resume.cursor().epoch());
  for (const auto& [id, lease] : job->leases) {
    if (!leases_.Remove(id).ok()) continue;
    auto owner = session_of_trainer_.find(lease.holder);
    if (owner == session_of_trainer_.end()) continue;
    auto holder = sessions_.find(owner->second);
    if (holder == sessions_.end() || holder->second.finished) continue;
    CoordinatorMessage revoke;
    revoke.mutable_revoke()->set_lease_id(id);
    revoke.mutable_revoke()->set_why(why);
    fx.sends.emplace_back(holder->second.sink, std::move(revoke));
  }
  JournalRecord record;
  *record.mutable_job_resumed() = resume;
  RETURN_IF_ERROR(CommitLocked(std::move(record), fx));
  // Sessions open before the resume belong to the run before the restart:
  // end them (FAILED_PRECONDITION, so a surviving Reader stops instead of
  // competing for the restored work).
  for (auto& [id, other] : sessions_) {
    if (other.hello && other.job == hello.job()) {
      FinishSessionLocked(
          other,
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
  for (auto& [id, other] : sessions_) {
    if (other.hello && !other.finished && other.job == hello.job() &&
        other.num_workers != workers) {
      FinishSessionLocked(
          other,
          absl::FailedPreconditionError(absl::StrCat(
              "job ", hello.job(), " is now read with ", workers,
              " reader(s) per rank (a session said num_workers=",
              hello.num_workers(), "); this session said ", other.num_workers)),
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
      PumpLocked(s.job, fx, &s);
      return absl::OkStatus();
    case v1::TrainerMessage::kHeartbeat:
      // The renewal above, and the consumer's input wait when reported.
      if (!m.heartbeat().has_input_wait()) return absl::OkStatus();
      return RecordInputWaitLocked(s, m.heartbeat().input_wait());
    case v1::TrainerMessage::kSync: {
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
      std::string lease_id;
      uint64_t fence = 0;
      int64_t consumed = -1;
      if (m.has_progress()) {
        lease_id = m.progress().lease_id(), fence = m.progress().fence(),
        consumed = m.progress().consumed();
      } else if (m.has_complete()) {
        lease_id = m.complete().lease_id(), fence = m.complete().fence();
      } else if (m.has_release()) {
        lease_id = m.release().lease_id(), fence = m.release().fence(),
        consumed = m.release().consumed();
      } else {
        lease_id = m.reroute().lease_id(), fence = m.reroute().fence(),
        consumed = m.reroute().consumed();
      }
      if (lease_id.size() > kMaxIdBytes) {
        fx.sends.emplace_back(
            s.sink, Rejected("", Invalid("lease_id",
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
      if (consumed < lease.consumed || consumed > size) {
        fx.sends.emplace_back(
            s.sink,
            Rejected(lease_id,
                     absl::InvalidArgumentError(absl::StrCat(
                         "lease ", lease_id, ": consumed=", consumed,
                         " must be in [", lease.consumed, ", ", size, "]"))));
        return absl::OkStatus();
      }
      if (consumed > lease.consumed || complete) {
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
        RETURN_IF_ERROR(leases_.SetProgress(lease_id, fence, consumed));
      }
      if (complete) {
        leases_.Remove(lease_id).IgnoreError();
        v1::LeaseCounts& counts = runtime_[lease.job].lease_counts;
        counts.set_completed(counts.completed() + 1);
        if (options_.metrics)
          options_.metrics->ForJob(lease.job).completed->Increment();
      } else if (m.has_release() || m.has_reroute()) {
        if (m.has_reroute() && !m.reroute().failed_data_server().empty()) {
          data_servers_.MarkSuspect(m.reroute().failed_data_server());
        }
        EndLeaseLocked(lease.job, lease_id,
                       m.has_release() ? "released" : "rerouted", fx);
      }
      // Only a new epoch or returned work concerns the other sessions; a
      // Complete or Progress frees (at most) this session's credit.
      const bool advanced = MaybeAdvanceEpochLocked(s.job, fx);
      PumpLocked(s.job, fx,
                 advanced || m.has_release() || m.has_reroute() ? nullptr : &s);
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          "session: empty or unknown trainer message");
  }
}

void CoordinatorService::EndLeaseLocked(const std::string& job_name,
                                        const std::string& lease_id,
                                        const std::string& reason,
                                        Effects& fx) {
  absl::StatusOr<LeaseEntry> lease = leases_.Remove(lease_id);
  if (!lease.ok()) return;
  JournalRecord record;
  record.mutable_lease_ended()->set_job(job_name);
  record.mutable_lease_ended()->set_lease_id(lease_id);
  record.mutable_lease_ended()->set_reason(reason);
  if (!CommitLocked(std::move(record), fx).ok()) return;
  const JobData* job = state_.FindJob(job_name);
  if (job == nullptr || job->epoch != lease->epoch) return;
  // The unconsumed remainder goes back to the front of its queue.
  if (lease->remaining() > 0) {
    const int32_t slot = job->plan.SlotOf(lease->rank, lease->worker);
    Piece piece{
        lease->sequence, lease->shard_index, lease->begin + lease->consumed,
        lease->end,      lease->rank,        slot};
    QueueForLocked(*job, runtime_[job_name], slot).push_front(piece);
  }
  v1::LeaseCounts& counts = runtime_[job_name].lease_counts;
  if (reason == "expired") {
    counts.set_expired(counts.expired() + 1);
  } else {
    counts.set_returned(counts.returned() + 1);
  }
  if (options_.metrics) {
    const CoordinatorMetrics::Job& m = options_.metrics->ForJob(job_name);
    (reason == "expired" ? m.expired : m.released)->Increment();
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
  const int32_t slot = job.plan.SlotOf(s.rank, s.worker);
  std::deque<Piece>& queue = QueueForLocked(job, rt, slot);
  const std::string reader =
      job.plan.workers_per_rank > 1
          ? absl::StrCat("rank ", s.rank, " worker ", s.worker)
          : absl::StrCat("rank ", s.rank);
  // Every reader takes at most its slot of the rank's quota (dynamic mode;
  // in static mode its queue holds just that), so a DataLoader worker's
  // pass ends with its own slot and never waits on another worker's.
  int64_t assigned = job.consumed_per_slot[slot];
  for (const auto& [id, l] : job.leases) {
    if (l.rank == s.rank && l.worker == s.worker)
      assigned += (l.end - l.begin) - l.acked;
  }
  const int64_t limit = job.plan.slot_quota(slot) - assigned;
  if (limit <= 0) {
    *why_kind = v1::WAITING_QUOTA_REACHED;
    *why_not = absl::StrCat(reader, " has its quota for epoch ", job.epoch,
                            "; waiting for the other readers to finish it");
    return false;
  }
  if (queue.empty()) {
    *why_kind = v1::WAITING_NO_WORK_LEFT;
    *why_not =
        absl::StrCat("no unassigned work left in epoch ", job.epoch, " for ",
                     reader, "; waiting for held leases to complete");
    return false;
  }
  Piece piece = queue.front();
  queue.pop_front();
  if (piece.size() > limit) {
    queue.push_front(Piece{piece.sequence, piece.shard_index,
                           piece.begin + limit, piece.end, piece.rank,
                           piece.slot});
    piece.end = piece.begin + limit;
  }
  // Above what the data servers report having seen, too (not journaled: the
  // grant record carries the fence chosen).
  const uint64_t fence = std::max(job.next_fence, seen_fence_floor_);
  const std::string lease_id =
      absl::StrCat(job.spec.name(), "/e", job.epoch, "/f", fence);
  JournalRecord record;
  auto* g = record.mutable_lease_granted();
  g->set_job(job.spec.name());
  g->set_epoch(job.epoch);
  g->set_rank(s.rank);
  g->set_worker(s.worker);
  g->set_sequence(piece.sequence);
  g->set_shard_index(piece.shard_index);
  g->set_begin(piece.begin);
  g->set_end(piece.end);
  g->set_fence(fence);
  g->set_lease_id(lease_id);
  g->set_holder(s.trainer_id);
  if (!CommitLocked(std::move(record), fx).ok()) return false;
  LeaseEntry entry =
      LiveLease(job.leases.at(lease_id), job.spec.name(), job.epoch);
  entry.data_server = RouteLocked(job, piece.shard_index);
  leases_.Add(std::move(entry), TtlLocked(job)).IgnoreError();
  CoordinatorMessage grant;
  *grant.mutable_grant()->mutable_lease() =
      LeaseToProtoLocked(*leases_.Find(lease_id), job);
  fx.sends.emplace_back(s.sink, std::move(grant));
  v1::LeaseCounts& counts = runtime_[job.spec.name()].lease_counts;
  counts.set_granted(counts.granted() + 1);
  if (options_.metrics)
    options_.metrics->ForJob(job.spec.name()).granted->Increment();
  HintUpcomingLocked(job, queue, fx);
  return true;
}

namespace {
bool IsRemoteShardUrl(const std::string& url) {
  return absl::StartsWith(url, "http://") ||
         absl::StartsWith(url, "https://") || absl::StartsWith(url, "s3://");
}
}  // namespace

const std::vector<ShuffleWindow>& CoordinatorService::WindowsLocked(
    const JobData& job) {
  JobRuntime& rt = runtime_[job.spec.name()];
  if (rt.windows_epoch != job.epoch) {
    rt.windows = PlanWindows(job.shard_samples, job.options, job.epoch);
    rt.windows_epoch = job.epoch;
  }
  return rt.windows;
}

std::string CoordinatorService::RouteLocked(const JobData& job,
                                            int32_t shard_index) {
  if (job.mix != nullptr) {
    // By the shard the block's first position reads (remembered per block).
    JobRuntime& rt = runtime_[job.spec.name()];
    if (rt.routes_epoch != job.epoch) {
      rt.block_routes.clear();
      rt.routes_epoch = job.epoch;
    }
    auto [it, added] = rt.block_routes.try_emplace(shard_index);
    if (added) {
      const int64_t at = shard_index * job.mix->block_samples();
      const std::vector<MixPlan::Segment> first =
          job.mix->Segments(job.epoch, at, at + 1);
      if (!first.empty() && !first[0].window->shards.empty()) {
        it->second = job.spec.sources(first[0].source)
                         .manifest()
                         .shards(first[0].window->shards[0])
                         .url();
      }
    }
    return data_servers_.Pick(it->second);
  }
  if (!UsesWindows(job.options))
    return data_servers_.Pick(job.spec.manifest().shards(shard_index).url());
  const ShuffleWindow& window = WindowsLocked(job).at(shard_index);
  if (window.shards.empty()) return data_servers_.Pick("");
  return data_servers_.Pick(job.spec.manifest().shards(window.shards[0]).url());
}

void CoordinatorService::HintUpcomingLocked(const JobData& job,
                                            const std::deque<Piece>& queue,
                                            Effects& fx) {
  if (options_.prefetch_hint_units <= 0 || data_servers_.empty()) return;
  std::map<int64_t, DataServerRegistry::HintTarget> targets;
  std::map<int64_t, v1::CoordinatorToDataServer> hints;
  int looked = 0;
  for (const Piece& piece : queue) {
    if (++looked > options_.prefetch_hint_units) break;
    // Remote shards of mixed jobs are fetched when a unit is read.
    if (job.mix != nullptr) break;
    // A window's shards all go to the server its units are routed to.
    std::vector<int32_t> shards{piece.shard_index};
    if (UsesWindows(job.options))
      shards = WindowsLocked(job).at(piece.shard_index).shards;
    const std::string server = RouteLocked(job, piece.shard_index);
    for (int32_t index : shards) {
      const v1::Shard& shard = job.spec.manifest().shards(index);
      if (!IsRemoteShardUrl(shard.url())) continue;
      std::optional<DataServerRegistry::HintTarget> target =
          data_servers_.NoteHint(server, shard.url());
      if (!target.has_value()) continue;
      *hints[target->id].mutable_prefetch()->add_shards() = shard;
      targets.emplace(target->id, std::move(*target));
    }
  }
  for (auto& [id, msg] : hints)
    fx.hints.emplace_back(targets.at(id).sink, std::move(msg));
}

void CoordinatorService::PumpLocked(const std::string& name, Effects& fx,
                                    Session* only) {
  const JobData* job = state_.FindJob(name);
  if (job == nullptr) return;
  JobRuntime& rt = runtime_[name];
  for (auto it = only != nullptr ? sessions_.find(only->id) : sessions_.begin();
       it != sessions_.end(); only != nullptr ? it = sessions_.end() : ++it) {
    Session& s = it->second;
    if (!s.hello || s.finished || s.job != name) continue;
    if (s.announced_epoch != job->epoch) {
      if (s.announced_epoch >= 0) {
        CoordinatorMessage end;
        end.mutable_epoch_end()->set_epoch(job->epoch - 1);
        fx.sends.emplace_back(s.sink, std::move(end));
      }
      s.announced_epoch = job->epoch;
      if (job->done) {
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
    int32_t held = static_cast<int32_t>(leases_.HeldBy(s.trainer_id).size());
    std::string why_not;
    v1::WaitingKind why_kind = v1::WAITING_KIND_UNSPECIFIED;
    if (options_.wait_for_data_servers && !data_servers_.AnyLive()) {
      // A grant must name a server to read from: the units wait.
      why_not =
          "no live data server: units wait until one registers with the "
          "coordinator";
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
  }
}

int CoordinatorService::ExpireLeases() {
  Effects fx;
  int expired = 0;
  {
    absl::MutexLock lock(&mu_);
    UpdateDataServerMetricLocked();  // servers that stopped heartbeating
    std::set<std::string> jobs;
    for (const std::string& id : leases_.FindExpired(1024)) {
      const LeaseEntry* lease = leases_.Find(id);
      if (lease == nullptr) continue;
      const std::string job = lease->job;
      LogInfo("lease %s of trainer %s expired; %d samples return to the queue",
              id, lease->holder, lease->remaining());
      EndLeaseLocked(job, id, "expired", fx);
      jobs.insert(job);
      ++expired;
    }
    for (const std::string& job : jobs) PumpLocked(job, fx);
    UpdateGaugesLocked();
    UpdateRankSkewLocked();
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
  absl::MutexLock lock(&mu_);
  return leases_.NextExpiry();
}

void CoordinatorService::Drain() {
  Effects fx;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, s] : sessions_) {
      FinishSessionLocked(
          s, absl::UnavailableError("coordinator is shutting down; reconnect"),
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

}  // namespace sluice
