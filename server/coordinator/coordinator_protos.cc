// CoordinatorService: jobs and leases as the API shows them (Job with its
// status, Lease with its signed token).
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/common/lease_token.h"
#include "server/common/logging.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/coordinator_service_internal.h"

namespace sluice {

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
  for (std::string& address : data_servers_.LiveAddressesIn(job.spec.pool()))
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
  const auto rt = runtime_.find(job.spec.name());
  if (rt != runtime_.end()) *st->mutable_leases() = rt->second.lease_counts;
  // Live leases and open sessions per rank, from the counts kept as they
  // change: a report costs O(ranks), not O(leases + sessions).
  const auto ranks = static_cast<size_t>(std::max(job.plan.num_ranks, 0));
  std::vector<int32_t> live(ranks, 0), sessions(ranks, 0);
  for (const auto& [rank, n] : job.live_leases_by_rank) {
    if (rank >= 0 && static_cast<size_t>(rank) < ranks) live[rank] = n;
  }
  if (const SessionTable::Open* open = sessions_.OpenOf(job.spec.name());
      open != nullptr) {
    for (const auto& [rank, n] : open->per_rank) {
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
    if (rt != runtime_.end()) {
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
    const ShuffleWindow& window = queues_.Windows(job).at(lease.shard_index);
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

}  // namespace sluice
