#include "server/coordinator/granter.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/common/logging.h"
#include "server/coordinator/coordinator_service_internal.h"
#include "server/coordinator/epoch_planner.h"

namespace sluice {
namespace {

bool IsRemoteShardUrl(const std::string& url) {
  return absl::StartsWith(url, "http://") ||
         absl::StartsWith(url, "https://") || absl::StartsWith(url, "s3://");
}

}  // namespace

std::variant<Granter::Grant, Granter::Wait> Granter::Next(
    const Session& reader, const JobData& job, uint64_t fence_floor,
    absl::FunctionRef<bool(int32_t slot)> keeps) {
  const int32_t slot = job.plan.SlotOf(reader.rank, reader.worker);
  // Named only when the grant is refused.
  auto name = [&] {
    return job.plan.workers_per_rank > 1
               ? absl::StrCat("rank ", reader.rank, " worker ", reader.worker)
               : absl::StrCat("rank ", reader.rank);
  };
  // Every reader takes at most its slot of the rank's quota (dynamic mode;
  // in static mode its queue holds just that), so a DataLoader worker's
  // pass ends with its own slot and never waits on another worker's.
  const int64_t assigned = job.consumed_per_slot[slot] +
                           job.outstanding_of(reader.rank, reader.worker);
  const int64_t limit = job.plan.slot_quota(slot) - assigned;
  if (limit <= 0) {
    return Wait{v1::WAITING_QUOTA_REACHED,
                absl::StrCat(name(), " has its quota for epoch ", job.epoch,
                             "; waiting for the other readers to finish it")};
  }
  // Above what the data servers report having seen, too (not journaled: the
  // grant record carries the fence chosen).
  const uint64_t fence = std::max(job.next_fence, fence_floor);
  if (fence >= coordinator_internal::kFenceLimit) {
    LogError("job %s: the fence space is used up; no lease is granted",
             job.spec.name());
    return Wait{};  // never reached by counting; refused rather than wrapped
  }
  // The first piece this reader may take: an expired lease's remainder goes
  // back to its own slot while that slot keeps it.
  WorkQueues::Shortage shortage = WorkQueues::Shortage::kNone;
  std::optional<Piece> piece;
  if (leases_ != nullptr && job.spec.mode() == v1::MODE_DYNAMIC &&
      job.mix == nullptr && !UsesWindows(job.options) &&
      leases_->OtherJobs(job.spec.name()) > 0) {
    piece = queues_->Take(
        job, slot, limit, keeps,
        [&](const Piece& p) {
          return leases_->ReadByOtherJob(
              job.spec.manifest().shards(p.shard_index).url(), job.spec.name(),
              p.begin, p.end);
        },
        &shortage);
  } else {
    piece = queues_->Take(job, slot, limit, keeps, &shortage);
  }
  if (!piece.has_value()) {
    return Wait{
        v1::WAITING_NO_WORK_LEFT,
        absl::StrCat("no unassigned work left in epoch ", job.epoch, " for ",
                     name(),
                     shortage == WorkQueues::Shortage::kEmpty
                         ? "; waiting for held leases to complete"
                         : "; waiting for other readers to re-read what their "
                           "expired leases returned")};
  }
  Grant grant;
  grant.piece = *piece;
  auto* g = grant.record.mutable_lease_granted();
  g->set_job(job.spec.name());
  g->set_epoch(job.epoch);
  g->set_rank(reader.rank);
  g->set_worker(reader.worker);
  g->set_sequence(piece->sequence);
  g->set_shard_index(piece->shard_index);
  g->set_begin(piece->begin);
  g->set_end(piece->end);
  g->set_fence(fence);
  g->set_lease_id(absl::StrCat(job.spec.name(), "/e", job.epoch, "/f", fence));
  g->set_holder(reader.trainer_id);
  grant.data_server = Route(job, piece->shard_index, piece->sequence, &reader,
                            &grant.same_node);
  return grant;
}

std::string Granter::Route(const JobData& job, int32_t shard_index,
                           int64_t sequence, const Session* reader,
                           bool* same_node) {
  const absl::Time now = clock_->Now();
  const auto pick = [&](const std::string& url) -> std::string {
    if (reader == nullptr) {
      return registry_->Pick(
          url, [](const std::string&) { return false; }, "", nullptr,
          job.spec.pool());
    }
    return registry_->Pick(
        url,
        [&](const std::string& address) {
          return reader->unreachable.Avoids(address, now);
        },
        reader->node, same_node, job.spec.pool());
  };
  if (job.mix != nullptr) return pick(queues_->BlockRoute(job, shard_index));
  if (!UsesWindows(job.options))
    return pick(job.spec.manifest().shards(shard_index).url());
  const ShuffleWindow& window = queues_->Windows(job).at(shard_index);
  if (window.shards.empty()) return pick("");
  const std::string& first = job.spec.manifest().shards(window.shards[0]).url();
  if (IsRemoteShardUrl(first)) return pick(first);
  return pick(absl::StrCat(first, "#", sequence));
}

void Granter::Hints(const JobData& job, int32_t slot, Effects& fx) {
  if (prefetch_hint_units_ <= 0 || registry_->empty()) return;
  // Remote shards of mixed jobs are fetched when a unit is read.
  if (job.mix != nullptr) return;
  std::map<int64_t, DataServerRegistry::HintTarget> targets;
  std::map<int64_t, v1::CoordinatorToDataServer> hints;
  int looked = 0;
  for (const Piece& piece : queues_->Upcoming(job, slot)) {
    if (++looked > prefetch_hint_units_) break;
    // A window of remote shards: all its units, so all its shards, go to
    // one server (Route).
    std::vector<int32_t> shards{piece.shard_index};
    if (UsesWindows(job.options))
      shards = queues_->Windows(job).at(piece.shard_index).shards;
    const std::string server = Route(job, piece.shard_index, piece.sequence);
    for (int32_t index : shards) {
      const v1::Shard& shard = job.spec.manifest().shards(index);
      if (!IsRemoteShardUrl(shard.url())) continue;
      std::optional<DataServerRegistry::HintTarget> target =
          registry_->NoteHint(server, shard.url());
      if (!target.has_value()) continue;
      *hints[target->id].mutable_prefetch()->add_shards() = shard;
      targets.emplace(target->id, std::move(*target));
    }
  }
  for (auto& [id, msg] : hints)
    fx.hints.emplace_back(targets.at(id).sink, std::move(msg));
}

}  // namespace sluice
