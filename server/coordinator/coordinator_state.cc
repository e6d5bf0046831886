#include "server/coordinator/coordinator_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice {

void IntervalSet::Add(int64_t begin, int64_t end) {
  if (begin >= end) return;
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= begin) {
      begin = prev->first;
      end = std::max(end, prev->second);
      it = ranges_.erase(prev);
    }
  }
  while (it != ranges_.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = ranges_.erase(it);
  }
  ranges_[begin] = end;
}

std::vector<std::pair<int64_t, int64_t>> IntervalSet::Missing(int64_t begin,
                                                              int64_t end) const {
  std::vector<std::pair<int64_t, int64_t>> result;
  int64_t cursor = begin;
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin()) --it;
  for (; it != ranges_.end() && it->first < end; ++it) {
    if (it->second <= cursor) continue;
    if (it->first > cursor) result.emplace_back(cursor, it->first);
    cursor = std::max(cursor, it->second);
  }
  if (cursor < end) result.emplace_back(cursor, end);
  return result;
}

int64_t IntervalSet::Covered() const {
  int64_t n = 0;
  for (const auto& [b, e] : ranges_) n += e - b;
  return n;
}

PlanOptions PlanOptionsFromSpec(const v1::JobSpec& spec) {
  PlanOptions options;
  options.seed = spec.seed();
  options.shuffle = spec.shuffle();
  options.world_size = spec.world_size();
  options.remainder = spec.remainder() == v1::REMAINDER_PAD ? RemainderPolicy::kPad
                                                            : RemainderPolicy::kDrop;
  options.max_samples_per_lease = spec.max_samples_per_lease();
  return options;
}

void CoordinatorState::StartEpoch(JobData& job, int64_t epoch) {
  job.epoch = epoch;
  job.done = job.spec.num_epochs() > 0 && epoch >= job.spec.num_epochs();
  job.plan = PlanEpoch(job.shard_samples, job.options, epoch);
  job.acked.clear();
  job.consumed_per_rank.assign(job.plan.num_ranks, 0);
  job.consumed_total = 0;
  job.leases.clear();
}

absl::Status CoordinatorState::Apply(const v1::internal::JournalRecord& record) {
  using R = v1::internal::JournalRecord;
  switch (record.record_case()) {
    case R::kJobCreated: {
      const v1::JobSpec& spec = record.job_created().spec();
      JobData job;
      job.spec = spec;
      for (const v1::Shard& s : spec.manifest().shards()) job.shard_samples.push_back(s.num_samples());
      job.options = PlanOptionsFromSpec(spec);
      job.create_time_unix_ms = record.time_unix_ms();
      StartEpoch(job, 0);
      jobs_[spec.name()] = std::move(job);
      return absl::OkStatus();
    }
    case R::kJobDeleted:
      jobs_.erase(record.job_deleted().job());
      return absl::OkStatus();
    case R::kEpochAdvanced: {
      auto it = jobs_.find(record.epoch_advanced().job());
      if (it == jobs_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("epoch advance for unknown job ", record.epoch_advanced().job()));
      }
      StartEpoch(it->second, record.epoch_advanced().epoch());
      return absl::OkStatus();
    }
    case R::kLeaseGranted: {
      const auto& g = record.lease_granted();
      auto it = jobs_.find(g.job());
      if (it == jobs_.end() || it->second.epoch != g.epoch()) {
        return absl::FailedPreconditionError(
            absl::StrCat("grant of lease ", g.lease_id(), " for unknown job/epoch ", g.job()));
      }
      DurableLease lease;
      lease.lease_id = g.lease_id();
      lease.fence = g.fence();
      lease.rank = g.rank();
      lease.sequence = g.sequence();
      lease.shard_index = g.shard_index();
      lease.begin = g.begin();
      lease.end = g.end();
      lease.holder = g.holder();
      it->second.leases[lease.lease_id] = lease;
      it->second.next_fence = std::max(it->second.next_fence, g.fence() + 1);
      return absl::OkStatus();
    }
    case R::kUnitAcked: {
      const auto& a = record.unit_acked();
      auto it = jobs_.find(a.job());
      if (it == jobs_.end() || it->second.epoch != a.epoch()) {
        return absl::FailedPreconditionError(
            absl::StrCat("ack for unknown job/epoch ", a.job(), "/", a.epoch()));
      }
      JobData& job = it->second;
      auto lease = job.leases.find(a.lease_id());
      if (lease == job.leases.end()) {
        return absl::FailedPreconditionError(absl::StrCat("ack for unknown lease ", a.lease_id()));
      }
      // [begin, begin + consumed) is newly acknowledged.
      job.acked[a.sequence()].Add(a.begin(), a.begin() + a.consumed());
      if (a.rank() >= 0 && a.rank() < static_cast<int32_t>(job.consumed_per_rank.size())) {
        job.consumed_per_rank[a.rank()] += a.consumed();
      }
      job.consumed_total += a.consumed();
      lease->second.acked += a.consumed();
      if (a.complete()) job.leases.erase(lease);
      return absl::OkStatus();
    }
    case R::kLeaseEnded: {
      auto it = jobs_.find(record.lease_ended().job());
      if (it != jobs_.end()) it->second.leases.erase(record.lease_ended().lease_id());
      return absl::OkStatus();
    }
    case R::kOnceFinished: {
      const auto& f = record.once_finished();
      once_finished_[absl::StrCat(f.scope(), "/", f.name())] = f;
      return absl::OkStatus();
    }
    case R::kJobResumed:
    case R::kSnapshot:
      return absl::UnimplementedError("record type not supported by this version");
    case R::RECORD_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("empty journal record");
}

const JobData* CoordinatorState::FindJob(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<Piece> CoordinatorState::PendingPieces(const JobData& job) const {
  std::map<int64_t, IntervalSet> taken = job.acked;
  for (const auto& [id, lease] : job.leases) taken[lease.sequence].Add(lease.begin, lease.end);
  std::vector<Piece> pieces;
  for (const PlannedUnit& u : job.plan.units) {
    auto it = taken.find(u.sequence);
    if (it == taken.end()) {
      pieces.push_back(Piece{u.sequence, u.shard_index, u.begin, u.end, u.rank});
      continue;
    }
    for (const auto& [b, e] : it->second.Missing(u.begin, u.end)) {
      pieces.push_back(Piece{u.sequence, u.shard_index, b, e, u.rank});
    }
  }
  return pieces;
}

const v1::internal::OnceFinished* CoordinatorState::FindOnceFinished(
    const std::string& scope, const std::string& name) const {
  auto it = once_finished_.find(absl::StrCat(scope, "/", name));
  return it == once_finished_.end() ? nullptr : &it->second;
}

}  // namespace sluice
