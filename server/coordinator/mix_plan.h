// MixPlan: the epochs of a job with sources (JobSpec.sources).
//
// Pure and deterministic, like EpochPlanner: everything is a function of the
// spec (sources, seed, shuffle, shuffle_window) and the epoch number.
//
//   Shares. Every epoch has the counts c_s of mix_order.h's Apportion
//   (explicit samples_per_epoch, the rest split by weight).
//   Streams. Source s serves its samples as an endless stream of passes;
//   pass p lists its shards in the order of EpochPlanner step 1 and 2 with
//   the source's own seed SourceSeed(seed, s) and p as the epoch (windows of
//   interleaved shards with shuffle and shuffle_window > 1, else whole
//   shards), so every pass is a fresh shuffle holding each sample once.
//   Epoch e takes stream positions [e * c_s, (e + 1) * c_s) of source s.
//   A source with ON_EXHAUSTED_STOP has one pass in all: in the epoch that
//   reaches its end it takes only what is left, and nothing afterwards, so
//   that epoch and the later ones are shorter.
//   Sequence. Epoch e's positions 0..L-1 (L = sum of that epoch's counts)
//   interleave the sources as mix_order.h specifies; position p is the next
//   stream sample of its source. The planner sees the sequence as blocks of
//   block_samples() positions (the last one shorter): a unit is a range of
//   positions inside one block, so resumes and re-plans work on positions
//   exactly as for one dataset, and a unit stays about one shuffle window
//   of each source.
#ifndef SLUICE_SERVER_COORDINATOR_MIX_PLAN_H_
#define SLUICE_SERVER_COORDINATOR_MIX_PLAN_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/coordinator/epoch_planner.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

struct MixSourceShape {
  std::string name;
  std::vector<int64_t> shard_samples;  // per shard of the source's manifest
  int64_t per_epoch = 0;               // c_s
  bool stop = false;                   // ON_EXHAUSTED_STOP
  // One pass: the sum of shard_samples (set by MixPlan).
  int64_t num_samples() const { return total; }
  int64_t total = 0;
};

// Source s's seed: Mix(Mix(seed) ^ Mix(s + 0x632BE59BD9B4E019)).
uint64_t SourceSeed(uint64_t seed, int32_t source);

class MixPlan {
 public:
  // `options` gives seed, shuffle and shuffle_window (quotas do not
  // matter); `block_samples` >= 1.
  MixPlan(std::vector<MixSourceShape> sources, const PlanOptions& options,
          int64_t block_samples);

  const std::vector<MixSourceShape>& sources() const { return sources_; }
  int64_t block_samples() const { return block_; }

  // c_s of epoch `epoch` (shortened for stopped sources).
  std::vector<int64_t> EpochCounts(int64_t epoch) const;
  // Where source s's `k`-th sample of epoch `epoch` lies in its stream:
  // (pass, position in the pass).
  std::pair<int64_t, int64_t> StreamPosition(int32_t source, int64_t epoch,
                                             int64_t k) const;
  // The epoch's sequence as blocks for PlanSequence (shard_index = block,
  // begin/end = positions of the epoch).
  std::vector<SampleRange> EpochSequence(int64_t epoch) const;

  // One shuffle window of a source's pass (a whole shard when the job does
  // not use windows).
  struct Window {
    std::vector<int32_t> shards;  // of the source's manifest, served order
    int64_t samples = 0;
    uint64_t order_seed = 0;  // 0 for a one-shard window (file order)
  };
  // Consecutive samples of one source at some positions of an epoch:
  // positions [begin, end) of one window of one pass.
  struct Segment {
    int32_t source = 0;
    int64_t pass = 0;
    std::shared_ptr<const Window> window;
    int64_t begin = 0;
    int64_t end = 0;
  };
  // What epoch `epoch`'s positions [begin, end) read: per source in source
  // order, its segments in stream order.
  std::vector<Segment> Segments(int64_t epoch, int64_t begin,
                                int64_t end) const;
  // The augmentation key of source s's pass `pass` (MixSegment.augment_seed):
  // Mix(SourceSeed(seed, s) ^ Mix(pass + 0x2545F4914F6CDD1D)).
  uint64_t AugmentSeed(int32_t source, int64_t pass) const;
  // Samples of each source among positions [begin, end) of `epoch`.
  std::vector<int64_t> SourceCounts(int64_t epoch, int64_t begin,
                                    int64_t end) const;

 private:
  struct Pass {
    std::vector<std::shared_ptr<const Window>> windows;
    std::vector<int64_t> starts;  // first position of each window, + total
  };
  std::shared_ptr<const Pass> PassOf(int32_t source, int64_t pass) const;
  // MixCountsBefore(counts, position) for `epoch`, stepped from a recent
  // answer a few positions before when there is one (grants and
  // acknowledgements come in position order).
  std::vector<int64_t> CountsAt(int64_t epoch,
                                const std::vector<int64_t>& counts,
                                int64_t position) const;

  std::vector<MixSourceShape> sources_;  // set in the constructor only
  const PlanOptions options_;
  const int64_t block_;

  mutable absl::Mutex mu_;
  // Recently used passes, most recent first.
  mutable std::list<
      std::pair<std::pair<int32_t, int64_t>, std::shared_ptr<const Pass>>>
      passes_ ABSL_GUARDED_BY(mu_);
  struct Counted {
    int64_t epoch = -1;
    int64_t position = 0;
    std::vector<int64_t> counts;
  };
  mutable std::vector<Counted> recent_ ABSL_GUARDED_BY(mu_);
  mutable size_t recent_next_ ABSL_GUARDED_BY(mu_) = 0;
};

// Each source's samples per epoch for a validated spec with sources: the
// explicit counts, and samples_per_epoch minus their sum apportioned over the
// weights (mix_order.h).
std::vector<int64_t> SourceShares(const v1::JobSpec& spec);

// The block size of a validated spec with sources: about one shuffle window
// of every source per block, min over the sources s with a share of
// floor(window_shards * mean shard samples of s * L / c_s), at least 1
// (window_shards = shuffle_window with windows, else 1).
int64_t MixBlockSamples(const v1::JobSpec& spec,
                        const std::vector<int64_t>& shares);

// Appends manifest shard `index` to a window's or a mixed unit's pieces.
v1::WindowPiece* AddPiece(
    const v1::Shard& shard, int32_t index,
    google::protobuf::RepeatedPtrField<v1::WindowPiece>* pieces);

// Fills `unit`'s mix_samples, segments and pieces for positions [begin, end) of
// `epoch` (common.proto's MixedUnit); `spec` holds the sources' manifests.
void MixUnitToProto(const MixPlan& plan, const v1::JobSpec& spec, int64_t epoch,
                    int64_t begin, int64_t end, v1::MixedUnit* unit);

// The MixPlan of a validated spec with sources (null without sources).
std::shared_ptr<const MixPlan> MixPlanFromSpec(const v1::JobSpec& spec,
                                               const PlanOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_MIX_PLAN_H_
