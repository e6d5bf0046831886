#include "server/coordinator/epoch_planner.h"

#include <algorithm>
#include <utility>

namespace sluice {

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

std::vector<ShuffleWindow> PlanWindows(
    const std::vector<int64_t>& shard_samples, const PlanOptions& options,
    int64_t epoch) {
  std::vector<ShuffleWindow> windows;
  if (!UsesWindows(options)) return windows;
  const int32_t n = static_cast<int32_t>(shard_samples.size());
  const std::vector<int32_t> order = ShardOrder(n, options.seed, epoch, true);
  const std::vector<int32_t> bounds = WindowBounds(n, options.shuffle_window);
  for (size_t w = 0; w + 1 < bounds.size(); ++w) {
    ShuffleWindow window;
    for (int32_t i = bounds[w]; i < bounds[w + 1]; ++i) {
      window.shards.push_back(order[i]);
      window.samples += std::max<int64_t>(shard_samples[order[i]], 0);
    }
    window.order_seed =
        WindowOrderSeed(options.seed, epoch, static_cast<int64_t>(w));
    windows.push_back(std::move(window));
  }
  return windows;
}

EpochPlan PlanEpoch(const std::vector<int64_t>& shard_samples,
                    const PlanOptions& options, int64_t epoch) {
  if (UsesWindows(options)) {
    const std::vector<ShuffleWindow> windows =
        PlanWindows(shard_samples, options, epoch);
    std::vector<SampleRange> sequence;
    sequence.reserve(windows.size());
    for (size_t w = 0; w < windows.size(); ++w) {
      sequence.push_back(
          SampleRange{static_cast<int32_t>(w), 0, windows[w].samples});
    }
    return PlanSequence(sequence, options, epoch);
  }
  const std::vector<int32_t> order =
      ShardOrder(static_cast<int32_t>(shard_samples.size()), options.seed,
                 epoch, options.shuffle);
  std::vector<SampleRange> sequence;
  sequence.reserve(order.size());
  for (int32_t shard : order)
    sequence.push_back(SampleRange{shard, 0, shard_samples[shard]});
  return PlanSequence(sequence, options, epoch);
}

EpochPlan PlanSequence(const std::vector<SampleRange>& sequence,
                       const PlanOptions& options, int64_t epoch) {
  EpochPlan plan;
  plan.epoch = epoch;
  for (const SampleRange& r : sequence)
    plan.total_samples += std::max<int64_t>(r.size(), 0);
  plan.num_ranks = std::max(options.world_size, 1);
  plan.workers_per_rank = std::max(options.workers_per_rank, 1);
  const Quota quota = ComputeQuota(plan.total_samples, options);
  plan.samples_per_rank = quota.samples_per_rank;
  plan.dropped = quota.dropped;
  plan.padded = quota.padded;
  plan.rank_begin.assign(plan.num_ranks + 1, 0);
  const int64_t limit = options.max_samples_per_lease;

  // Walk the (cyclic) sequence of ranges, handing each rank its q samples.
  size_t pos = 0;      // index into `sequence`
  int64_t offset = 0;  // samples of sequence[pos] already handed out
  auto skip_empty = [&] {
    // Move past exhausted or empty ranges, wrapping around for PAD.
    size_t guard = 0;
    while (sequence[pos].size() - offset <= 0 && guard++ <= sequence.size()) {
      pos = (pos + 1) % sequence.size();
      offset = 0;
    }
  };
  if (plan.total_samples > 0) {
    for (int32_t r = 0; r < plan.num_ranks; ++r) {
      plan.rank_begin[r] = static_cast<int64_t>(plan.units.size());
      for (int32_t w = 0; w < plan.workers_per_rank; ++w) {
        int64_t need =
            SlotQuota(plan.samples_per_rank, plan.workers_per_rank, w);
        int64_t run = 0;  // samples of the current range given to this slot
        size_t run_range = SIZE_MAX;
        while (need > 0) {
          skip_empty();
          const SampleRange& range = sequence[pos];
          if (pos != run_range) {
            run_range = pos;
            run = 0;
          }
          int64_t take = std::min(need, range.size() - offset);
          if (limit > 0) take = std::min(take, limit - run % limit);
          PlannedUnit unit;
          unit.shard_index = range.shard_index;
          unit.begin = range.begin + offset;
          unit.end = range.begin + offset + take;
          unit.sequence = static_cast<int64_t>(plan.units.size());
          unit.rank = r;
          unit.slot = plan.SlotOf(r, w);
          plan.units.push_back(unit);
          need -= take;
          run += take;
          offset += take;
        }
      }
    }
  }
  plan.rank_begin[plan.num_ranks] = static_cast<int64_t>(plan.units.size());
  return plan;
}

}  // namespace sluice
