// CoordinatorService: the trainer Session protocol (Hello, resume, workers,
// heartbeats with input wait, Progress / Complete / Reroute / Release).
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
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/coordinator_service_internal.h"
#include "server/coordinator/tenant_limits.h"

namespace sluice {

using coordinator_internal::Invalid;
using coordinator_internal::kMaxIdBytes;
using coordinator_internal::kMaxReadersPerJob;
using coordinator_internal::kMaxWorkersPerRank;
using coordinator_internal::Rejected;
using v1::CoordinatorMessage;

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

}  // namespace sluice
