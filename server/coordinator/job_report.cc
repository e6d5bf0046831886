#include "server/coordinator/job_report.h"

#include <google/protobuf/field_mask.pb.h>
#include <google/protobuf/util/field_mask_util.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "server/coordinator/mix_plan.h"

namespace sluice {
namespace {

using google::protobuf::FieldMask;
using google::protobuf::util::FieldMaskUtil;

// The paths of `message`'s fields but `skip` (top level only).
template <typename Message>
FieldMask AllFieldsBut(std::initializer_list<absl::string_view> skip) {
  FieldMask mask;
  const google::protobuf::Descriptor* d = Message::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const std::string& name = d->field(i)->name();
    if (std::find(skip.begin(), skip.end(), name) == skip.end())
      mask.add_paths(name);
  }
  return mask;
}

// `spec` without its manifests (its sources' too), which may hold a million
// shards: every other field is copied, the manifests never are.
void CopyWithoutManifests(const v1::JobSpec& spec, v1::JobSpec* out) {
  static const FieldMask* const kSpec =
      new FieldMask(AllFieldsBut<v1::JobSpec>({"manifest", "sources"}));
  static const FieldMask* const kSource =
      new FieldMask(AllFieldsBut<v1::Source>({"manifest"}));
  const FieldMaskUtil::MergeOptions merge;
  FieldMaskUtil::MergeMessageTo(spec, *kSpec, merge, out);
  for (const v1::Source& source : spec.sources())
    FieldMaskUtil::MergeMessageTo(source, *kSource, merge, out->add_sources());
}

}  // namespace

v1::Job JobToProto(const JobData& job, bool include_manifest,
                   const JobSoftState& soft) {
  v1::Job out;
  if (include_manifest) {
    *out.mutable_spec() = job.spec;
  } else {
    CopyWithoutManifests(job.spec, out.mutable_spec());
  }
  out.set_create_time_unix_ms(job.create_time_unix_ms);
  v1::JobStatus* st = out.mutable_status();
  for (const std::string& address : soft.live_data_servers)
    st->add_live_data_servers(address);
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
  st->set_num_shards(static_cast<int32_t>(job.shard_samples->size()));
  if (job.mix != nullptr) {
    const std::vector<int64_t> counts = job.mix->EpochCounts(job.epoch);
    // REMAINDER_DROP serves the sequence's first served_per_epoch()
    // positions: what each source has there is what it serves.
    const std::vector<int64_t> served =
        job.plan.dropped > 0
            ? job.mix->SourceCounts(job.epoch, 0, job.served_per_epoch())
            : counts;
    int32_t shards = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      const MixSourceShape& src = job.mix->sources()[i];
      const auto s = static_cast<int32_t>(i);
      shards += static_cast<int32_t>(src.shard_samples.size());
      v1::SourceStatus* ss = st->add_sources();
      ss->set_name(src.name);
      ss->set_samples_in_epoch(counts[i]);
      const int64_t served_i = i < served.size() ? served[i] : counts[i];
      ss->set_dropped_in_epoch(counts[i] - served_i);
      ss->set_consumed_in_epoch(job.done ? served_i
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
  if (soft.lease_counts != nullptr) *st->mutable_leases() = *soft.lease_counts;
  // Live leases and open sessions per rank, from the counts kept as they
  // change: a report costs O(ranks), not O(leases + sessions).
  const auto ranks = static_cast<size_t>(std::max(job.plan.num_ranks, 0));
  std::vector<int32_t> live(ranks, 0), sessions(ranks, 0);
  for (const auto& [rank, n] : job.live_leases_by_rank) {
    if (rank >= 0 && static_cast<size_t>(rank) < ranks) live[rank] = n;
  }
  if (soft.sessions_per_rank != nullptr) {
    for (const auto& [rank, n] : *soft.sessions_per_rank) {
      if (rank >= 0 && static_cast<size_t>(rank) < ranks) sessions[rank] = n;
    }
  }
  for (int32_t r = 0; r < job.plan.num_ranks; ++r) {
    v1::RankStatus* rs = st->add_ranks();
    rs->set_rank(r);
    rs->set_consumed(job.done && job.plan.samples_per_rank > 0
                         ? job.plan.samples_per_rank
                         : job.consumed_by_rank(r));
    rs->set_quota(job.plan.samples_per_rank);
    rs->set_live_leases(live[r]);
    rs->set_sessions(sessions[r]);
    if (soft.input_wait_by_rank != nullptr) {
      if (auto w = soft.input_wait_by_rank->find(r);
          w != soft.input_wait_by_rank->end()) {
        rs->set_input_wait_seconds(w->second);
      }
    }
  }
  return out;
}

void UnitToProto(const JobData& job, int64_t epoch, int32_t index,
                 int64_t begin, int64_t end, int64_t sequence,
                 const std::vector<ShuffleWindow>& windows,
                 v1::WorkUnit* unit) {
  if (job.mix != nullptr) {
    v1::MixedUnit* mixed = unit->mutable_mixed();
    mixed->set_block_index(index);
    MixUnitToProto(*job.mix, job.spec, epoch, begin, end, mixed);
  } else if (UsesWindows(job.options)) {
    const ShuffleWindow& window = windows.at(index);
    v1::WindowUnit* w = unit->mutable_window();
    w->set_window_index(index);
    w->set_window_order(window.order_seed);
    for (int32_t shard : window.shards)
      AddPiece(job.spec.manifest().shards(shard), shard, w->mutable_pieces());
  } else {
    const v1::Shard& shard = job.spec.manifest().shards(index);
    v1::ShardRange* range = unit->mutable_shard();
    range->set_shard_index(index);
    range->set_url(shard.url());
    range->set_size_bytes(shard.size_bytes());
    range->set_checksum(shard.checksum());
  }
  unit->set_begin(begin);
  unit->set_end(end);
  unit->set_sequence(sequence);
}

v1::Lease LeaseToProto(const LeaseEntry& lease, const JobData& job,
                       const std::vector<ShuffleWindow>& windows) {
  v1::Lease out;
  out.set_lease_id(lease.lease_id);
  out.set_fence(lease.fence);
  out.set_job(lease.job);
  out.set_epoch(lease.epoch);
  out.set_rank(job.spec.world_size() > 0 ? lease.rank : -1);
  UnitToProto(job, lease.epoch, lease.shard_index, lease.begin, lease.end,
              lease.sequence, windows, out.mutable_unit());
  out.set_data_server(lease.data_server);
  out.set_expires_at_unix_ms(absl::ToUnixMillis(lease.expires_at));
  out.set_on_corrupt(job.spec.on_corrupt());
  out.set_augment_seed(job.spec.seed());
  out.set_weight(std::max(job.spec.weight(), 1));
  out.set_tenant(job.spec.tenant());
  return out;
}

}  // namespace sluice
