#include "server/coordinator/coordinator_state.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

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

std::vector<std::pair<int64_t, int64_t>> IntervalSet::Missing(
    int64_t begin, int64_t end) const {
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
  options.remainder = spec.remainder() == v1::REMAINDER_PAD
                          ? RemainderPolicy::kPad
                          : RemainderPolicy::kDrop;
  options.max_samples_per_lease = spec.max_samples_per_lease();
  options.shuffle_window = spec.shuffle_window();
  return options;
}

namespace {

// Counts positions [begin, end) of the job's epoch towards their sources.
// `newly`: acknowledged now, not rebuilt from a log.
void CountSources(JobData& job, int64_t begin, int64_t end,
                  bool newly = false) {
  if (job.mix == nullptr || end <= begin) return;
  const std::vector<int64_t> n = job.mix->SourceCounts(job.epoch, begin, end);
  job.consumed_per_source.resize(n.size(), 0);
  job.consumed_per_source_total.resize(n.size(), 0);
  for (size_t s = 0; s < n.size(); ++s) {
    job.consumed_per_source[s] += n[s];
    if (newly) job.consumed_per_source_total[s] += n[s];
  }
}

// The dataset's shape and plan options from the job's spec.
void InitShape(JobData& job) {
  auto shard_samples = std::make_shared<std::vector<int64_t>>();
  shard_samples->reserve(job.spec.manifest().shards_size());
  for (const v1::Shard& s : job.spec.manifest().shards())
    shard_samples->push_back(s.num_samples());
  job.shard_samples = std::move(shard_samples);
  job.options = PlanOptionsFromSpec(job.spec);
  job.mix = MixPlanFromSpec(job.spec, job.options);
  // A sum of the URLs' hashes: the same for any order of the same shards.
  job.shards_fingerprint = 0;
  if (job.mix == nullptr) {
    for (const v1::Shard& s : job.spec.manifest().shards())
      job.shards_fingerprint += absl::Hash<std::string>{}(s.url());
  }
  job.consumed_per_source.assign(
      job.mix != nullptr ? job.mix->sources().size() : 0, 0);
}

DurableLease LeaseFromRecord(const v1::internal::LeaseGranted& g) {
  DurableLease lease;
  lease.lease_id = g.lease_id();
  lease.fence = g.fence();
  lease.rank = g.rank();
  lease.worker = g.worker();
  lease.sequence = g.sequence();
  lease.shard_index = g.shard_index();
  lease.begin = g.begin();
  lease.end = g.end();
  lease.holder = g.holder();
  return lease;
}

int64_t LogSize(const std::vector<AckedRange>& log) {
  int64_t n = 0;
  for (const AckedRange& r : log) n += r.end - r.begin;
  return n;
}

// The first `count` acknowledged samples of one slot.
std::vector<AckedRange> LogPrefix(const std::vector<AckedRange>& log,
                                  int64_t count) {
  std::vector<AckedRange> out;
  for (const AckedRange& r : log) {
    if (count <= 0) break;
    AckedRange cut = r;
    cut.end = std::min(r.end, r.begin + count);
    count -= cut.end - cut.begin;
    out.push_back(cut);
  }
  return out;
}

// What follows the first `count` acknowledged samples of one slot.
std::vector<AckedRange> LogSuffix(const std::vector<AckedRange>& log,
                                  int64_t count) {
  std::vector<AckedRange> out;
  for (const AckedRange& r : log) {
    const int64_t size = r.end - r.begin;
    if (count >= size) {
      count -= size;
      continue;
    }
    AckedRange cut = r;
    cut.begin = r.begin + std::max<int64_t>(count, 0);
    count = 0;
    out.push_back(cut);
  }
  return out;
}

// The samples of `plan` not in `consumed`, in plan order.
std::vector<SampleRange> Unconsumed(
    const EpochPlan& plan, const std::map<int64_t, IntervalSet>& consumed) {
  std::vector<SampleRange> remaining;
  for (const PlannedUnit& u : plan.units) {
    auto it = consumed.find(u.sequence);
    if (it == consumed.end()) {
      remaining.push_back(SampleRange{u.shard_index, u.begin, u.end});
      continue;
    }
    for (const auto& [b, e] : it->second.Missing(u.begin, u.end)) {
      remaining.push_back(SampleRange{u.shard_index, b, e});
    }
  }
  return remaining;
}

}  // namespace

EpochPlan PlanInputs::Plan() const {
  return mix != nullptr
             ? PlanSequence(mix->EpochSequence(epoch), options, epoch)
             : PlanEpoch(*shard_samples, options, epoch);
}

void CoordinatorState::OfferPlan(const std::string& job, PreparedPlan plan) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || plan.epoch < it->second.epoch) return;
  if (plan.shard_samples != it->second.shard_samples ||
      plan.mix != it->second.mix) {
    return;  // planned from another job of that name
  }
  std::vector<PreparedPlan>& offers = offered_plans_[job];
  for (PreparedPlan& o : offers) {
    if (o.epoch == plan.epoch && o.options == plan.options) {
      o = std::move(plan);
      return;
    }
  }
  if (offers.size() >= kMaxOfferedPlans) offers.erase(offers.begin());
  offers.push_back(std::move(plan));
}

bool CoordinatorState::HasOfferedPlan(const std::string& job,
                                      const PlanOptions& options,
                                      int64_t epoch) const {
  auto it = offered_plans_.find(job);
  if (it == offered_plans_.end()) return false;
  for (const PreparedPlan& o : it->second) {
    if (o.epoch == epoch && o.options == options) return true;
  }
  return false;
}

bool CoordinatorState::HasOfferedSerial(const std::string& job,
                                        uint64_t serial) const {
  auto it = offered_plans_.find(job);
  if (it == offered_plans_.end()) return false;
  for (const PreparedPlan& o : it->second) {
    if (o.serial == serial) return true;
  }
  return false;
}

EpochPlan CoordinatorState::TakePlan(JobData& job, const PlanOptions& options,
                                     int64_t epoch) {
  std::optional<PreparedPlan> taken;
  auto it = offered_plans_.find(job.spec.name());
  if (it != offered_plans_.end()) {
    std::vector<PreparedPlan> kept;
    for (PreparedPlan& o : it->second) {
      if (!taken.has_value() && o.epoch == epoch && o.options == options) {
        taken = std::move(o);
      } else if (o.epoch >= epoch) {
        kept.push_back(std::move(o));  // the epoch's others, later epochs
      }
    }
    if (kept.empty()) {
      offered_plans_.erase(it);
    } else {
      it->second = std::move(kept);
    }
  }
  if (taken.has_value()) {
    ++plans_offered_taken_;
    job.plan_serial = taken->serial;
    return std::move(taken->plan);
  }
  ++plans_computed_;
  job.plan_serial = 0;
  return job.PlanOf(options, epoch);
}

void CoordinatorState::StartEpoch(JobData& job, int64_t epoch) {
  // Keep the finished epoch for cursors taken in it (only the latest one).
  job.history.clear();
  if (epoch == job.epoch + 1) {
    job.history.push_back(EpochHistory{
        std::move(job.plan), std::move(job.ack_log), job.replanned,
        std::move(job.replan_sequence), std::move(job.rolled_back)});
  }
  job.rolled_back.clear();
  job.replanned = false;
  job.replan_sequence.clear();
  job.epoch = epoch;
  job.done = job.spec.num_epochs() > 0 && epoch >= job.spec.num_epochs();
  job.plan = TakePlan(job, job.options, epoch);
  job.ack_log.assign(job.plan.num_slots(), {});
  job.acked.clear();
  job.consumed_per_slot.assign(job.plan.num_slots(), 0);
  job.consumed_total = 0;
  job.consumed_per_source.assign(
      job.mix != nullptr ? job.mix->sources().size() : 0, 0);
  job.leases.clear();
  job.outstanding.clear();
  job.live_leases_by_rank.clear();
}

absl::Status CoordinatorState::Apply(
    const v1::internal::JournalRecord& record) {
  using R = v1::internal::JournalRecord;
  switch (record.record_case()) {
    case R::kJobCreated: {
      JobData job;
      job.spec = record.job_created().spec();
      AddJob(std::move(job), record.time_unix_ms());
      return absl::OkStatus();
    }
    case R::kJobDeleted:
      // next_fence_floor_ already covers the job's fences (LeaseGranted).
      jobs_.erase(record.job_deleted().job());
      offered_plans_.erase(record.job_deleted().job());
      return absl::OkStatus();
    case R::kEpochAdvanced: {
      auto it = jobs_.find(record.epoch_advanced().job());
      if (it == jobs_.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "epoch advance for unknown job ", record.epoch_advanced().job()));
      }
      StartEpoch(it->second, record.epoch_advanced().epoch());
      return absl::OkStatus();
    }
    case R::kLeaseGranted: {
      const auto& g = record.lease_granted();
      auto it = jobs_.find(g.job());
      if (it == jobs_.end() || it->second.epoch != g.epoch()) {
        return absl::FailedPreconditionError(
            absl::StrCat("grant of lease ", g.lease_id(),
                         " for unknown job/epoch ", g.job()));
      }
      DurableLease lease = LeaseFromRecord(g);
      if (auto old = it->second.leases.find(lease.lease_id);
          old != it->second.leases.end()) {
        it->second.CountOutstanding(old->second, -1);
      }
      it->second.CountOutstanding(lease, 1);
      it->second.leases[lease.lease_id] = lease;
      it->second.next_fence = std::max(it->second.next_fence, g.fence() + 1);
      next_fence_floor_ = std::max(next_fence_floor_, g.fence() + 1);
      return absl::OkStatus();
    }
    case R::kUnitAcked: {
      const auto& a = record.unit_acked();
      auto it = jobs_.find(a.job());
      if (it == jobs_.end() || it->second.epoch != a.epoch()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "ack for unknown job/epoch ", a.job(), "/", a.epoch()));
      }
      JobData& job = it->second;
      auto lease = job.leases.find(a.lease_id());
      if (lease == job.leases.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("ack for unknown lease ", a.lease_id()));
      }
      // [begin, begin + consumed) is newly acknowledged.
      job.acked[a.sequence()].Add(a.begin(), a.begin() + a.consumed());
      const bool known_slot = a.rank() >= 0 && a.rank() < job.plan.num_ranks &&
                              a.worker() >= 0 &&
                              a.worker() < job.plan.workers_per_rank;
      const int32_t slot =
          known_slot ? job.plan.SlotOf(a.rank(), a.worker()) : -1;
      if (known_slot) job.consumed_per_slot[slot] += a.consumed();
      job.consumed_total += a.consumed();
      CountSources(job, a.begin(), a.begin() + a.consumed(), /*newly=*/true);
      if (a.consumed() > 0 && known_slot) {
        std::vector<AckedRange>& log = job.ack_log[slot];
        if (!log.empty() && log.back().sequence == a.sequence() &&
            log.back().end == a.begin()) {
          log.back().end += a.consumed();
        } else {
          log.push_back(AckedRange{a.sequence(), a.shard_index(), a.begin(),
                                   a.begin() + a.consumed()});
        }
      }
      job.CountOutstanding(lease->second, -1);
      lease->second.acked += a.consumed();
      if (a.complete()) {
        job.leases.erase(lease);
      } else {
        job.CountOutstanding(lease->second, 1);
      }
      return absl::OkStatus();
    }
    case R::kLeaseEnded: {
      auto it = jobs_.find(record.lease_ended().job());
      if (it != jobs_.end()) {
        auto lease = it->second.leases.find(record.lease_ended().lease_id());
        if (lease != it->second.leases.end()) {
          it->second.CountOutstanding(lease->second, -1);
          it->second.leases.erase(lease);
        }
      }
      return absl::OkStatus();
    }
    case R::kOnceFinished: {
      const auto& f = record.once_finished();
      once_finished_[{f.scope(), f.name()}] = f;
      return absl::OkStatus();
    }
    case R::kOnceReset:
      once_finished_.erase(
          {record.once_reset().scope(), record.once_reset().name()});
      return absl::OkStatus();
    case R::kJobResumed:
      return ApplyResume(record.job_resumed());
    case R::kWorkersSet:
      return ApplyWorkersSet(record.workers_set());
    case R::kResumeJoined: {
      const auto& joined = record.resume_joined();
      auto it = jobs_.find(joined.job());
      if (it == jobs_.end() || !it->second.last_resume.has_value()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "resume join for job ", joined.job(), " without a resume"));
      }
      (*it->second.last_resume->mutable_launches())[joined.slot()] =
          joined.launch_id();
      return absl::OkStatus();
    }
    case R::kSnapshot:
      return ApplySnapshot(record.snapshot());
    case R::RECORD_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("empty journal record");
}

absl::Status CoordinatorState::CheckResume(
    const v1::internal::JobResumed& resume) const {
  const v1::Cursor& c = resume.cursor();
  const JobData* target = FindJob(resume.job());
  if (target == nullptr)
    return absl::NotFoundError(
        absl::StrCat("job ", resume.job(), " not found"));
  const JobData* source = FindJob(c.job());
  if (source == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("hello.cursor.job: job ", c.job(), " not found"));
  }
  if (source != target) {
    const v1::JobSpec& a = source->spec;
    const v1::JobSpec& b = target->spec;
    auto same_sources = [&] {
      if (a.sources_size() != b.sources_size() ||
          a.samples_per_epoch() != b.samples_per_epoch())
        return false;
      for (int i = 0; i < a.sources_size(); ++i) {
        if (!google::protobuf::util::MessageDifferencer::Equals(a.sources(i),
                                                                b.sources(i)))
          return false;
      }
      return true;
    };
    const char* differs = !google::protobuf::util::MessageDifferencer::Equals(
                              a.manifest(), b.manifest())
                              ? "manifest"
                          : !same_sources()            ? "sources"
                          : a.seed() != b.seed()       ? "seed"
                          : a.shuffle() != b.shuffle() ? "shuffle"
                          : a.shuffle_window() != b.shuffle_window()
                              ? "shuffle_window"
                              : nullptr;
    if (differs != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hello.cursor.job: job ", c.job(), " has a different ", differs,
          " than job ", resume.job(),
          "; a cursor moves only between jobs over the same data order"));
    }
  }
  for (int i = 0; i < c.sources_size(); ++i) {
    const auto& sources = target->spec.sources();
    // "" = a name the reader had not seen.
    if (i >= sources.size() ||
        (!c.sources(i).empty() && sources[i].name() != c.sources(i))) {
      std::string names;
      for (const v1::Source& src : sources)
        absl::StrAppend(&names, names.empty() ? "" : ", ", src.name());
      return absl::InvalidArgumentError(
          absl::StrCat("hello.cursor.sources[", i, "]: source \"", c.sources(i),
                       "\" is not source ", i, " of job ", resume.job(),
                       " (its sources: ", names.empty() ? "none" : names, ")"));
    }
  }
  if (c.sources_size() > 0 && c.sources_size() != target->spec.sources_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.cursor.sources names ", c.sources_size(), " sources but job ",
        resume.job(), " has ", target->spec.sources_size()));
  }
  if (c.world_size() != source->spec.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.cursor.world_size=", c.world_size(), " but job ",
                     c.job(), " has world_size ", source->spec.world_size()));
  }
  const AckLog* log = nullptr;
  if (c.epoch() == source->epoch && !source->done) {
    log = &source->ack_log;
  } else if (c.epoch() == source->epoch - 1 && !source->history.empty()) {
    log = &source->history.front().ack_log;
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        "hello.cursor.epoch=", c.epoch(), ": job ", c.job(), " is in epoch ",
        source->epoch,
        " and keeps only the current and the previous epoch for resuming"));
  }
  const EpochPlan& plan =
      log == &source->ack_log ? source->plan : source->history.front().plan;
  const int32_t workers = std::max(c.workers_per_rank(), 1);
  if (workers != plan.workers_per_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.cursor.workers_per_rank=", workers, " but epoch ", c.epoch(),
        " of job ", c.job(), " was read with ", plan.workers_per_rank,
        " reader(s) per rank (DataLoader workers); a cursor names every "
        "reader's count"));
  }
  const bool per_worker = workers > 1;
  const char* field = per_worker ? "consumed_per_worker" : "consumed_per_rank";
  const int counts =
      per_worker ? c.consumed_per_worker_size() : c.consumed_per_rank_size();
  if (counts != static_cast<int>(log->size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.cursor.", field, " has ", counts, " entries; job ", c.job(),
        " has ", log->size(), per_worker ? " readers" : " ranks"));
  }
  for (int r = 0; r < counts; ++r) {
    const int64_t n =
        per_worker ? c.consumed_per_worker(r) : c.consumed_per_rank(r);
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("hello.cursor.", field, "[", r, "]=", n,
                       (n == -1 ? " is unknown: merge every rank's cursor "
                                  "(sluice::MergeCursors) before "
                                  "saving a checkpoint"
                                : " must be >= 0")));
    }
    const int64_t acked = LogSize((*log)[r]);
    if (n > acked) {
      return absl::FailedPreconditionError(absl::StrCat(
          "hello.cursor.", field, "[", r, "]=", n, " but ",
          per_worker
              ? absl::StrCat("rank ", r / workers, " worker ", r % workers)
              : absl::StrCat("rank ", r),
          " of job ", c.job(), " acknowledged only ", acked,
          " samples in epoch ", c.epoch(),
          " (take cursors with Reader::Cursor(), which waits for its reports "
          "to be durable)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::ApplyResume(
    const v1::internal::JobResumed& resume) {
  RETURN_IF_ERROR(CheckResume(resume));
  const v1::Cursor& c = resume.cursor();
  const JobData& source = jobs_.at(c.job());
  JobData& target = jobs_.at(resume.job());
  const bool previous = c.epoch() != source.epoch;
  const EpochPlan& source_plan =
      previous ? source.history.front().plan : source.plan;
  const AckLog& source_log =
      previous ? source.history.front().ack_log : source.ack_log;
  bool replanned =
      previous ? source.history.front().replanned : source.replanned;
  std::vector<SampleRange> replan_sequence =
      previous ? source.history.front().replan_sequence
               : source.replan_sequence;
  const bool per_worker = source_plan.workers_per_rank > 1;
  AckLog kept(source_log.size());
  // What the slots acknowledged past the cursor, after what earlier
  // resumes of the epoch cut off.
  AckLog rolled_back =
      previous ? source.history.front().rolled_back : source.rolled_back;
  rolled_back.resize(source_log.size());
  std::map<int64_t, IntervalSet> consumed;  // sequence -> samples
  for (size_t r = 0; r < source_log.size(); ++r) {
    const int i = static_cast<int>(r);
    kept[r] = LogPrefix(source_log[r], per_worker ? c.consumed_per_worker(i)
                                                  : c.consumed_per_rank(i));
    const std::vector<AckedRange> tail =
        LogSuffix(source_log[r], LogSize(kept[r]));
    rolled_back[r].insert(rolled_back[r].end(), tail.begin(), tail.end());
    for (const AckedRange& a : kept[r])
      consumed[a.sequence].Add(a.begin, a.end);
  }
  const int32_t workers = std::max(resume.workers_per_rank(), 1);
  target.options.workers_per_rank = workers;
  EpochPlan plan;
  if (&source == &target && workers == source_plan.workers_per_rank) {
    // Same job, world size and readers per rank: every reader keeps its
    // share and continues right after its last consumed sample.
    plan = source_plan;
  } else {
    // Another world size or number of readers per rank: the epoch's
    // unconsumed samples, in plan order, are planned afresh over this job's
    // readers (G3 balance again).
    std::vector<SampleRange> remaining = Unconsumed(source_plan, consumed);
    plan = PlanSequence(remaining, target.options, c.epoch());
    replanned = true;
    replan_sequence = std::move(remaining);
    kept.assign(plan.num_slots(), {});
    rolled_back.clear();
    consumed.clear();
  }
  target.history.clear();
  target.epoch = c.epoch();
  target.done = false;
  target.replanned = replanned;
  target.replan_sequence = std::move(replan_sequence);
  target.plan = std::move(plan);
  target.plan_serial = 0;
  target.leases.clear();
  target.outstanding.clear();
  target.live_leases_by_rank.clear();
  target.acked = std::move(consumed);
  target.consumed_per_slot.assign(target.plan.num_slots(), 0);
  target.consumed_total = 0;
  target.consumed_per_source.assign(
      target.mix != nullptr ? target.mix->sources().size() : 0, 0);
  for (size_t r = 0; r < kept.size(); ++r) {
    target.consumed_per_slot[r] = LogSize(kept[r]);
    target.consumed_total += target.consumed_per_slot[r];
    for (const AckedRange& a : kept[r]) CountSources(target, a.begin, a.end);
  }
  target.ack_log = std::move(kept);
  target.rolled_back = std::move(rolled_back);
  target.last_resume = resume;
  return absl::OkStatus();
}

absl::Status CoordinatorState::ApplyWorkersSet(
    const v1::internal::WorkersSet& set) {
  auto it = jobs_.find(set.job());
  if (it == jobs_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("workers set for unknown job ", set.job()));
  }
  JobData& job = it->second;
  if (job.epoch != set.epoch() || !job.leases.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", set.job(), " epoch ", job.epoch,
                     " has leases out: its readers per rank cannot change"));
  }
  job.options.workers_per_rank = std::max(set.workers_per_rank(), 1);
  if (job.consumed_total > 0) {
    // Part of the epoch is consumed: its remaining samples, in plan order,
    // are planned afresh over the new readers (as a resume re-balances).
    job.replan_sequence = Unconsumed(job.plan, job.acked);
    job.replanned = true;
    job.acked.clear();
    job.consumed_total = 0;
    job.consumed_per_source.assign(job.consumed_per_source.size(), 0);
  }
  if (job.replanned) {
    job.plan = PlanSequence(job.replan_sequence, job.options, job.epoch);
    job.plan_serial = 0;
  } else {
    job.plan = TakePlan(job, job.options, job.epoch);
  }
  job.ack_log.assign(job.plan.num_slots(), {});
  job.rolled_back.clear();
  job.consumed_per_slot.assign(job.plan.num_slots(), 0);
  return absl::OkStatus();
}

namespace {

void RangesToProto(const std::vector<AckedRange>& in,
                   v1::internal::RankAckLog* out) {
  for (const AckedRange& a : in) {
    auto* r = out->add_ranges();
    r->set_sequence(a.sequence);
    r->set_shard_index(a.shard_index);
    r->set_begin(a.begin);
    r->set_end(a.end);
  }
}

void EpochToProto(int64_t epoch, int32_t workers, bool replanned,
                  const std::vector<SampleRange>& sequence, const AckLog& log,
                  const AckLog& rolled_back, v1::internal::EpochSnapshot* out) {
  out->set_epoch(epoch);
  out->set_workers_per_rank(workers);
  out->set_replanned(replanned);
  for (const SampleRange& r : sequence) {
    auto* p = out->add_replan_sequence();
    p->set_shard_index(r.shard_index);
    p->set_begin(r.begin);
    p->set_end(r.end);
  }
  for (const auto& rank : log) RangesToProto(rank, out->add_ack_log());
  for (const auto& slot : rolled_back)
    RangesToProto(slot, out->add_rolled_back());
}

// The plan and log of one epoch from its snapshot.
void EpochFromProto(const v1::internal::EpochSnapshot& in, const JobData& job,
                    EpochPlan* plan, AckLog* log, bool* replanned,
                    std::vector<SampleRange>* sequence, AckLog* rolled_back) {
  *replanned = in.replanned();
  sequence->clear();
  for (const auto& r : in.replan_sequence()) {
    sequence->push_back(SampleRange{r.shard_index(), r.begin(), r.end()});
  }
  PlanOptions options = job.options;
  options.workers_per_rank = std::max(in.workers_per_rank(), 1);
  *plan = in.replanned() ? PlanSequence(*sequence, options, in.epoch())
                         : job.PlanOf(options, in.epoch());
  log->assign(plan->num_slots(), {});
  for (int r = 0; r < in.ack_log_size() && r < plan->num_slots(); ++r) {
    for (const auto& a : in.ack_log(r).ranges()) {
      (*log)[r].push_back(
          AckedRange{a.sequence(), a.shard_index(), a.begin(), a.end()});
    }
  }
  rolled_back->clear();
  for (int r = 0; r < in.rolled_back_size() && r < plan->num_slots(); ++r) {
    rolled_back->resize(plan->num_slots());
    for (const auto& a : in.rolled_back(r).ranges()) {
      (*rolled_back)[r].push_back(
          AckedRange{a.sequence(), a.shard_index(), a.begin(), a.end()});
    }
  }
}

}  // namespace

v1::internal::JournalRecord CoordinatorState::Snapshot() const {
  v1::internal::JournalRecord record;
  v1::internal::Snapshot* snap = record.mutable_snapshot();
  snap->set_next_fence_floor(next_fence_floor_);
  for (const auto& [name, job] : jobs_) {
    v1::internal::JobSnapshot* j = snap->add_jobs();
    *j->mutable_spec() = job.spec;
    j->set_create_time_unix_ms(job.create_time_unix_ms);
    j->set_done(job.done);
    j->set_next_fence(job.next_fence);
    EpochToProto(job.epoch, job.plan.workers_per_rank, job.replanned,
                 job.replan_sequence, job.ack_log, job.rolled_back,
                 j->mutable_current());
    if (!job.history.empty()) {
      const EpochHistory& h = job.history.front();
      EpochToProto(h.plan.epoch, h.plan.workers_per_rank, h.replanned,
                   h.replan_sequence, h.ack_log, h.rolled_back,
                   j->mutable_previous());
    }
    for (const auto& [id, l] : job.leases) {
      v1::internal::LeaseSnapshot* ls = j->add_leases();
      v1::internal::LeaseGranted* g = ls->mutable_granted();
      g->set_job(name);
      g->set_epoch(job.epoch);
      g->set_rank(l.rank);
      g->set_worker(l.worker);
      g->set_sequence(l.sequence);
      g->set_shard_index(l.shard_index);
      g->set_begin(l.begin);
      g->set_end(l.end);
      g->set_fence(l.fence);
      g->set_lease_id(l.lease_id);
      g->set_holder(l.holder);
      ls->set_acked(l.acked);
    }
    if (job.last_resume.has_value())
      *j->mutable_last_resume() = *job.last_resume;
  }
  for (const auto& [key, finished] : once_finished_)
    *snap->add_once() = finished;
  return record;
}

absl::Status CoordinatorState::ApplySnapshot(
    const v1::internal::Snapshot& snap) {
  jobs_.clear();
  offered_plans_.clear();
  once_finished_.clear();
  next_fence_floor_ = std::max<uint64_t>(1, snap.next_fence_floor());
  for (const v1::internal::JobSnapshot& j : snap.jobs()) {
    next_fence_floor_ = std::max(next_fence_floor_, j.next_fence());
    JobData job;
    job.spec = j.spec();
    InitShape(job);
    job.create_time_unix_ms = j.create_time_unix_ms();
    job.epoch = j.current().epoch();
    job.done = j.done();
    job.next_fence = j.next_fence();
    job.options.workers_per_rank = std::max(j.current().workers_per_rank(), 1);
    EpochFromProto(j.current(), job, &job.plan, &job.ack_log, &job.replanned,
                   &job.replan_sequence, &job.rolled_back);
    if (j.has_previous()) {
      EpochHistory h;
      EpochFromProto(j.previous(), job, &h.plan, &h.ack_log, &h.replanned,
                     &h.replan_sequence, &h.rolled_back);
      job.history.push_back(std::move(h));
    }
    // Acknowledged samples and counts follow from the log.
    job.consumed_per_slot.assign(job.plan.num_slots(), 0);
    for (size_t r = 0; r < job.ack_log.size(); ++r) {
      for (const AckedRange& a : job.ack_log[r]) {
        job.acked[a.sequence].Add(a.begin, a.end);
        job.consumed_per_slot[r] += a.end - a.begin;
        job.consumed_total += a.end - a.begin;
        CountSources(job, a.begin, a.end);
      }
    }
    for (const v1::internal::LeaseSnapshot& ls : j.leases()) {
      const v1::internal::LeaseGranted& g = ls.granted();
      DurableLease lease = LeaseFromRecord(g);
      lease.acked = ls.acked();
      job.CountOutstanding(lease, 1);
      job.leases[lease.lease_id] = lease;
    }
    if (j.has_last_resume()) job.last_resume = j.last_resume();
    jobs_[job.spec.name()] = std::move(job);
  }
  for (const auto& f : snap.once()) once_finished_[{f.scope(), f.name()}] = f;
  return absl::OkStatus();
}

void CoordinatorState::AddJob(JobData job, int64_t create_time_unix_ms) {
  offered_plans_.erase(job.spec.name());  // a job of that name before
  InitShape(job);
  job.create_time_unix_ms = create_time_unix_ms;
  job.next_fence = next_fence_floor_;
  StartEpoch(job, 0);
  std::string name = job.spec.name();
  jobs_[std::move(name)] = std::move(job);
}

absl::Status CoordinatorState::Apply(v1::internal::JournalRecord&& record) {
  if (record.record_case() != v1::internal::JournalRecord::kJobCreated) {
    return Apply(static_cast<const v1::internal::JournalRecord&>(record));
  }
  JobData job;
  job.spec = std::move(*record.mutable_job_created()->mutable_spec());
  AddJob(std::move(job), record.time_unix_ms());
  return absl::OkStatus();
}

const JobData* CoordinatorState::FindJob(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<Piece> CoordinatorState::PendingPieces(const JobData& job) const {
  std::map<int64_t, IntervalSet> taken = job.acked;
  for (const auto& [id, lease] : job.leases)
    taken[lease.sequence].Add(lease.begin, lease.end);
  std::vector<Piece> pieces;
  for (const PlannedUnit& u : job.plan.units) {
    auto it = taken.find(u.sequence);
    if (it == taken.end()) {
      pieces.push_back(
          Piece{u.sequence, u.shard_index, u.begin, u.end, u.rank, u.slot});
      continue;
    }
    for (const auto& [b, e] : it->second.Missing(u.begin, u.end)) {
      pieces.push_back(Piece{u.sequence, u.shard_index, b, e, u.rank, u.slot});
    }
  }
  return pieces;
}

std::vector<v1::internal::OnceFinished> CoordinatorState::OnceFinishedIn(
    const std::string& scope) const {
  std::vector<v1::internal::OnceFinished> out;
  for (const auto& [key, finished] : once_finished_) {
    if (scope.empty() || finished.scope() == scope) out.push_back(finished);
  }
  return out;
}

const v1::internal::OnceFinished* CoordinatorState::FindOnceFinished(
    const std::string& scope, const std::string& name) const {
  auto it = once_finished_.find({scope, name});
  return it == once_finished_.end() ? nullptr : &it->second;
}

}  // namespace sluice
