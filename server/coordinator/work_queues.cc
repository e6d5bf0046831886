#include "server/coordinator/work_queues.h"

#include <iterator>
#include <utility>

namespace sluice {

bool WorkQueues::PerSlot(const JobData& job) {
  return job.spec.mode() == v1::MODE_STATIC && job.spec.world_size() > 0;
}

void WorkQueues::KeepOffered(JobQueues& q,
                             absl::FunctionRef<bool(uint64_t serial)> offered) {
  for (auto it = q.fresh.begin(); it != q.fresh.end();) {
    it = offered(it->first) ? std::next(it) : q.fresh.erase(it);
  }
}

void WorkQueues::Rebuild(const JobData& job,
                         absl::FunctionRef<std::vector<Piece>()> pending,
                         absl::FunctionRef<bool(uint64_t serial)> offered) {
  JobQueues& q = jobs_[job.spec.name()];
  const bool per_slot = PerSlot(job);
  auto fresh = q.fresh.find(job.plan_serial);
  if (job.plan_serial != 0 && fresh != q.fresh.end() && job.acked.empty() &&
      job.leases.empty()) {
    q.queues = std::move(fresh->second);
  } else {
    q.queues.assign(per_slot ? job.plan.num_slots() : 1, {});
    for (const Piece& p : pending()) {
      q.queues[per_slot ? p.slot : 0].push_back(p);
    }
  }
  KeepOffered(q, offered);
}

void WorkQueues::Offer(const std::string& name, uint64_t serial,
                       std::vector<std::deque<Piece>> queues,
                       absl::FunctionRef<bool(uint64_t serial)> offered) {
  JobQueues& q = jobs_[name];
  if (offered(serial)) q.fresh[serial] = std::move(queues);
  KeepOffered(q, offered);
}

void WorkQueues::Erase(const std::string& name) { jobs_.erase(name); }

std::deque<Piece>& WorkQueues::QueueOf(const JobData& job, int32_t slot) {
  JobQueues& q = jobs_[job.spec.name()];
  const bool per_slot = PerSlot(job);
  const size_t want = per_slot ? static_cast<size_t>(job.plan.num_slots()) : 1;
  if (q.queues.size() < want) q.queues.resize(want);
  return q.queues[per_slot ? static_cast<size_t>(slot) : 0];
}

std::optional<Piece> WorkQueues::Take(
    const JobData& job, int32_t slot, int64_t limit,
    absl::FunctionRef<bool(int32_t slot)> keeps, Shortage* why) {
  return Take(
      job, slot, limit, keeps, [](const Piece&) { return false; }, why);
}

std::optional<Piece> WorkQueues::Take(
    const JobData& job, int32_t slot, int64_t limit,
    absl::FunctionRef<bool(int32_t slot)> keeps,
    absl::FunctionRef<bool(const Piece&)> prefer, Shortage* why) {
  std::deque<Piece>& queue = QueueOf(job, slot);
  if (queue.empty()) {
    *why = Shortage::kEmpty;
    return std::nullopt;
  }
  const auto may_take = [&](const Piece& p) {
    return p.returned_to < 0 || p.returned_to == slot || !keeps(p.returned_to);
  };
  auto it = queue.begin();
  while (it != queue.end() && !may_take(*it)) ++it;
  if (it == queue.end()) {
    *why = Shortage::kOthersRemainders;
    return std::nullopt;
  }
  int looked = 0;
  for (auto next = it; next != queue.end() && looked < kSteerLookahead;
       ++next, ++looked) {
    if (may_take(*next) && prefer(*next)) {
      it = next;
      break;
    }
  }
  Piece piece = *it;
  it = queue.erase(it);
  if (piece.size() > limit) {
    Piece rest = piece;
    rest.begin = piece.begin + limit;
    queue.insert(it, rest);
    piece.end = piece.begin + limit;
  }
  *why = Shortage::kNone;
  return piece;
}

void WorkQueues::Return(const JobData& job, int32_t slot, const Piece& piece) {
  QueueOf(job, slot).push_front(piece);
}

const std::deque<Piece>& WorkQueues::Upcoming(const JobData& job,
                                              int32_t slot) {
  return QueueOf(job, slot);
}

const std::vector<ShuffleWindow>& WorkQueues::Windows(const JobData& job) {
  JobQueues& q = jobs_[job.spec.name()];
  if (q.windows_epoch != job.epoch) {
    q.windows = UsesWindows(job.options)
                    ? PlanWindows(*job.shard_samples, job.options, job.epoch)
                    : std::vector<ShuffleWindow>{};
    q.windows_epoch = job.epoch;
  }
  return q.windows;
}

const std::string& WorkQueues::BlockRoute(const JobData& job, int32_t block) {
  JobQueues& q = jobs_[job.spec.name()];
  if (q.routes_epoch != job.epoch) {
    q.block_routes.clear();
    q.routes_epoch = job.epoch;
  }
  auto [it, added] = q.block_routes.try_emplace(block);
  if (added && job.mix != nullptr) {
    const int64_t at = block * job.mix->block_samples();
    const std::vector<MixPlan::Segment> first =
        job.mix->Segments(job.epoch, at, at + 1);
    if (!first.empty() && !first[0].window->shards.empty()) {
      it->second = job.spec.sources(first[0].source)
                       .manifest()
                       .shards(first[0].window->shards[0])
                       .url();
    }
  }
  return it->second;
}

}  // namespace sluice
