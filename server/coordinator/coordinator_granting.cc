// CoordinatorService: the queues' rebuilds and plans made ahead, pumping
// sessions with the Granter's grants, epoch advance.
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

namespace sluice {

using coordinator_internal::JobDoneMessage;
using coordinator_internal::LiveLease;
using v1::CoordinatorMessage;

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
