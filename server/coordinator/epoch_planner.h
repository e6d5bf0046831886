// EpochPlanner: the order of an epoch's work units, and each rank's share.
//
// Pure: no I/O, no clock, no hash-map iteration, no std:: distributions. The
// plan of epoch `e` is a function of (seed, e, shard sample counts, options)
// alone, specified here so another implementation can reproduce it exactly:
//
//   1. Shard order. Without shuffle: manifest order. With shuffle: start
//      from manifest order [0, 1, ..., n-1] and run Fisher-Yates from the
//      back: for i = n-1 down to 1, j = Next() mod (i+1), swap(order[i],
//      order[j]), Next() being SplitMix64(seed, e)
//      (server/common/shuffle_window.h).
//   2. Epoch sequence: every shard's samples 0..num_samples-1, shards in that
//      order. Its length T is the dataset's total sample count. With shuffle
//      and shuffle_window S > 1, the shards in that order are grouped into
//      windows instead (server/common/shuffle_window.h), and the sequence
//      is every window's positions 0..N_w-1, windows in order: in steps 3-5
//      a window stands where a shard stood, and a unit's shard_index is its
//      window's number.
//   3. Quotas (W = max(world_size, 1)): DROP gives every rank q = floor(T/W)
//      and serves the first q*W samples of the sequence; PAD gives q =
//      ceil(T/W) and serves the sequence followed by its own first q*W - T
//      samples again (cyclically, should that exceed T). world_size 0 means
//      one pool with q = T.
//   4. Ranks: rank r owns positions [r*q, (r+1)*q) of the served sequence
//      (contiguous blocks keep each rank on few shards). With K readers per
//      rank (DataLoader workers, `workers_per_rank`), the rank's block is
//      cut into K consecutive slots, slot w of q/K + (w < q mod K ? 1 : 0)
//      samples; slot index = r*K + w. Every rank's slots have the same
//      sizes, so every rank's worker w yields the same number of batches.
//   5. Units: each slot's block is cut at shard boundaries and every
//      max_samples_per_lease samples (counted from where the slot's block
//      enters the shard). Units are numbered 0, 1, ... in served order
//      (`sequence`).
#ifndef SLUICE_SERVER_COORDINATOR_EPOCH_PLANNER_H_
#define SLUICE_SERVER_COORDINATOR_EPOCH_PLANNER_H_

#include <cstdint>
#include <vector>

#include "server/common/shuffle_window.h"

namespace sluice {

enum class RemainderPolicy { kDrop, kPad };

struct PlanOptions {
  uint64_t seed = 0;
  bool shuffle = false;
  // 0 = no quotas (one pool).
  int32_t world_size = 0;
  RemainderPolicy remainder = RemainderPolicy::kDrop;
  // 0 = no limit below a shard (units end at shard and rank boundaries).
  int64_t max_samples_per_lease = 0;
  // Shards per shuffle window (step 2); <= 1 or no shuffle = none.
  int32_t shuffle_window = 0;
  // Readers sharing each rank's quota, each with a slot of its own (step
  // 4). Not part of the job spec: set by the sessions (Hello.num_workers).
  int32_t workers_per_rank = 1;

  bool operator==(const PlanOptions& o) const {
    return seed == o.seed && shuffle == o.shuffle &&
           world_size == o.world_size && remainder == o.remainder &&
           max_samples_per_lease == o.max_samples_per_lease &&
           shuffle_window == o.shuffle_window &&
           workers_per_rank == o.workers_per_rank;
  }
  bool operator!=(const PlanOptions& o) const { return !(*this == o); }
};

// Samples of slot `worker` when a rank's quota q is split over `workers`.
inline int64_t SlotQuota(int64_t q, int32_t workers, int32_t worker) {
  if (workers <= 1) return q;
  return q / workers + (worker < q % workers ? 1 : 0);
}

struct PlannedUnit {
  int32_t shard_index = 0;
  int64_t begin = 0;  // first sample, inclusive
  int64_t end = 0;    // one past the last sample
  int64_t sequence = 0;
  int32_t rank = 0;  // the rank whose block holds the unit (0 without quotas)
  int32_t slot = 0;  // rank * workers_per_rank + worker
  int64_t size() const { return end - begin; }
  bool operator==(const PlannedUnit& o) const {
    return shard_index == o.shard_index && begin == o.begin && end == o.end &&
           sequence == o.sequence && rank == o.rank && slot == o.slot;
  }
};

struct EpochPlan {
  int64_t epoch = 0;
  int64_t total_samples = 0;     // T
  int32_t num_ranks = 1;         // max(world_size, 1)
  int64_t samples_per_rank = 0;  // q
  int32_t workers_per_rank = 1;  // K
  int64_t dropped = 0;           // samples not served (DROP)
  int64_t padded = 0;            // samples served twice (PAD)
  // All units in served order; rank r's units are
  // units[rank_begin[r] .. rank_begin[r+1]).
  std::vector<PlannedUnit> units;
  std::vector<int64_t> rank_begin;

  int32_t num_slots() const { return num_ranks * workers_per_rank; }
  int32_t SlotOf(int32_t rank, int32_t worker) const {
    return rank * workers_per_rank + worker;
  }
  int32_t RankOfSlot(int32_t slot) const { return slot / workers_per_rank; }
  int64_t slot_quota(int32_t slot) const {
    return SlotQuota(samples_per_rank, workers_per_rank,
                     slot % workers_per_rank);
  }
};

// Step 1: the epoch's shard order.
std::vector<int32_t> ShardOrder(int32_t num_shards, uint64_t seed,
                                int64_t epoch, bool shuffle);

// One shuffle window of an epoch (step 2).
struct ShuffleWindow {
  std::vector<int32_t> shards;  // manifest indexes, in served order
  int64_t samples = 0;          // N_w
  uint64_t order_seed = 0;      // WindowOrderSeed(seed, epoch, w)
};

// True when `options` plan windows rather than shards.
inline bool UsesWindows(const PlanOptions& options) {
  return options.shuffle && options.shuffle_window > 1;
}

// Step 2's windows of epoch `epoch` (empty unless UsesWindows(options)).
std::vector<ShuffleWindow> PlanWindows(
    const std::vector<int64_t>& shard_samples, const PlanOptions& options,
    int64_t epoch);

// Steps 1-5. `shard_samples[i]` is shard i's sample count (>= 0).
EpochPlan PlanEpoch(const std::vector<int64_t>& shard_samples,
                    const PlanOptions& options, int64_t epoch);

// Samples [begin, end) of one shard.
struct SampleRange {
  int32_t shard_index = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Steps 3-5 over an explicit epoch sequence: PlanEpoch is PlanSequence over
// the shuffled shards taken whole. A resume with a different world size
// (G7) plans the epoch's unconsumed ranges this way; there, the
// max_samples_per_lease cut counts from the start of each range.
EpochPlan PlanSequence(const std::vector<SampleRange>& sequence,
                       const PlanOptions& options, int64_t epoch);

// Per-rank quota and remainder without building units (for job status).
struct Quota {
  int64_t samples_per_rank = 0;
  int64_t dropped = 0;
  int64_t padded = 0;
};
Quota ComputeQuota(int64_t total_samples, const PlanOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_EPOCH_PLANNER_H_
