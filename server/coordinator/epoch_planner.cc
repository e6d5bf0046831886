#include "server/coordinator/epoch_planner.h"

#include <algorithm>
#include <utility>

namespace sluice {

uint64_t SplitMix64::Mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ULL;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return z;
}

SplitMix64::SplitMix64(uint64_t seed, int64_t epoch)
    : state_(Mix(seed) ^ Mix(static_cast<uint64_t>(epoch) ^ 0xD1B54A32D192ED03ULL)) {}

uint64_t SplitMix64::Next() {
  state_ += 0x9E3779B97F4A7C15ULL;
  return Mix(state_);
}

std::vector<int32_t> ShardOrder(int32_t num_shards, uint64_t seed,
                                int64_t epoch, bool shuffle) {
  std::vector<int32_t> order(static_cast<size_t>(std::max(num_shards, 0)));
  for (int32_t i = 0; i < num_shards; ++i) order[i] = i;
  if (!shuffle) return order;
  SplitMix64 rng(seed, epoch);
  for (int64_t i = static_cast<int64_t>(order.size()) - 1; i >= 1; --i) {
    const uint64_t j = rng.Next() % static_cast<uint64_t>(i + 1);
    std::swap(order[i], order[j]);
  }
  return order;
}

Quota ComputeQuota(int64_t total_samples, const PlanOptions& options) {
  Quota quota;
  if (options.world_size <= 0) {
    quota.samples_per_rank = total_samples;
    return quota;
  }
  const int64_t w = options.world_size;
  if (options.remainder == RemainderPolicy::kPad) {
    quota.samples_per_rank = (total_samples + w - 1) / w;
    quota.padded = quota.samples_per_rank * w - total_samples;
  } else {
    quota.samples_per_rank = total_samples / w;
    quota.dropped = total_samples - quota.samples_per_rank * w;
  }
  return quota;
}

EpochPlan PlanEpoch(const std::vector<int64_t>& shard_samples,
                    const PlanOptions& options, int64_t epoch) {
  EpochPlan plan;
  plan.epoch = epoch;
  for (int64_t n : shard_samples) plan.total_samples += n;
  plan.num_ranks = std::max(options.world_size, 1);
  const Quota quota = ComputeQuota(plan.total_samples, options);
  plan.samples_per_rank = quota.samples_per_rank;
  plan.dropped = quota.dropped;
  plan.padded = quota.padded;
  plan.rank_begin.assign(plan.num_ranks + 1, 0);

  const std::vector<int32_t> order =
      ShardOrder(static_cast<int32_t>(shard_samples.size()), options.seed,
                 epoch, options.shuffle);
  const int64_t limit = options.max_samples_per_lease;

  // Walk the (cyclic) shard sequence, handing each rank its q samples.
  size_t pos = 0;        // index into `order`
  int64_t offset = 0;    // next sample within order[pos]
  auto skip_empty = [&] {
    // Move past exhausted or empty shards, wrapping around for PAD.
    size_t guard = 0;
    while (shard_samples[order[pos]] - offset <= 0 && guard++ <= order.size()) {
      pos = (pos + 1) % order.size();
      offset = 0;
    }
  };
  if (plan.total_samples > 0) {
    for (int32_t r = 0; r < plan.num_ranks; ++r) {
      plan.rank_begin[r] = static_cast<int64_t>(plan.units.size());
      int64_t need = plan.samples_per_rank;
      int64_t run = 0;  // samples of the current shard given to this rank
      int32_t run_shard = -1;
      while (need > 0) {
        skip_empty();
        const int32_t shard = order[pos];
        if (shard != run_shard) {
          run_shard = shard;
          run = 0;
        }
        int64_t take = std::min(need, shard_samples[shard] - offset);
        if (limit > 0) take = std::min(take, limit - run % limit);
        PlannedUnit unit;
        unit.shard_index = shard;
        unit.begin = offset;
        unit.end = offset + take;
        unit.sequence = static_cast<int64_t>(plan.units.size());
        unit.rank = r;
        plan.units.push_back(unit);
        need -= take;
        run += take;
        offset += take;
      }
    }
  }
  plan.rank_begin[plan.num_ranks] = static_cast<int64_t>(plan.units.size());
  return plan;
}

}  // namespace sluice
