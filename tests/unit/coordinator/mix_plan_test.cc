#include "server/coordinator/mix_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/mix_order.h"
#include "server/common/shuffle_window.h"
#include "server/coordinator/job_spec.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;

// (source, shard, sample) of every position [begin, end) of `epoch`, by
// expanding the segments with their windows' labels.
std::vector<std::tuple<int, int, int64_t>> Expand(const MixPlan& plan,
                                                  int64_t epoch, int64_t begin,
                                                  int64_t end) {
  std::map<int, std::vector<std::pair<int, int64_t>>> per_source;
  for (const MixPlan::Segment& seg : plan.Segments(epoch, begin, end)) {
    const auto& w = *seg.window;
    std::vector<int64_t> sizes;
    for (int32_t shard : w.shards)
      sizes.push_back(plan.sources()[seg.source].shard_samples[shard]);
    const std::vector<uint16_t> labels =
        w.shards.size() == 1 ? std::vector<uint16_t>(w.samples, 0)
                             : WindowLabels(sizes, w.order_seed);
    std::vector<int64_t> next(w.shards.size(), 0);
    for (int64_t p = 0; p < seg.end; ++p) {
      const uint16_t k = labels[p];
      if (p >= seg.begin)
        per_source[seg.source].emplace_back(w.shards[k], next[k]);
      ++next[k];
    }
  }
  std::vector<std::tuple<int, int, int64_t>> out;
  std::map<int, size_t> at;
  for (int32_t s : MixSources(plan.EpochCounts(epoch), begin, end)) {
    const auto& [shard, sample] = per_source[s][at[s]++];
    out.emplace_back(s, shard, sample);
  }
  for (const auto& [s, v] : per_source) EXPECT_EQ(at[s], v.size());
  return out;
}

MixPlan ThreeSources(bool stop_last, int32_t window) {
  std::vector<MixSourceShape> shapes(3);
  shapes[0] = {"a", {10, 10, 10, 10}, 25, false};
  shapes[1] = {"b", {3, 4}, 14, false};  // 7 samples: two passes an epoch
  shapes[2] = {"c", {5, 0, 5, 5}, 6, stop_last};
  PlanOptions options;
  options.seed = 11;
  options.shuffle = true;
  options.shuffle_window = window;
  return MixPlan(std::move(shapes), options, 8);
}

TEST(MixPlanTest, EverySourcePassHoldsEachSampleOnceInAFreshOrder) {
  for (int32_t window : {1, 2}) {
    const MixPlan plan = ThreeSources(false, window);
    std::vector<std::tuple<int, int, int64_t>> stream;
    for (int64_t e = 0; e < 4; ++e) {
      EXPECT_THAT(plan.EpochCounts(e), ElementsAre(25, 14, 6));
      const auto epoch = Expand(plan, e, 0, 45);
      ASSERT_EQ(epoch.size(), 45u);
      // Cut anywhere, the pieces give the same positions.
      std::vector<std::tuple<int, int, int64_t>> pieces;
      for (const SampleRange& r : plan.EpochSequence(e)) {
        for (int64_t at = r.begin; at < r.end; at += 3) {
          auto part = Expand(plan, e, at, std::min(r.end, at + 3));
          pieces.insert(pieces.end(), part.begin(), part.end());
        }
      }
      EXPECT_EQ(pieces, epoch) << "window " << window << " epoch " << e;
      stream.insert(stream.end(), epoch.begin(), epoch.end());
    }
    for (int s = 0; s < 3; ++s) {
      std::vector<std::pair<int, int64_t>> mine;
      for (const auto& [src, shard, sample] : stream)
        if (src == s) mine.emplace_back(shard, sample);
      const size_t pass = static_cast<size_t>(plan.sources()[s].num_samples());
      std::set<std::vector<std::pair<int, int64_t>>> orders;
      for (size_t at = 0; at + pass <= mine.size(); at += pass) {
        std::vector<std::pair<int, int64_t>> one(mine.begin() + at,
                                                 mine.begin() + at + pass);
        const std::set<std::pair<int, int64_t>> distinct(one.begin(),
                                                         one.end());
        EXPECT_EQ(distinct.size(), pass) << "source " << s << " pass " << at;
        orders.insert(one);
      }
      // b's eight passes: whole shards can only swap (two orders); a
      // window interleaves its two shards anew each pass.
      if (s == 1 && window == 1) {
        EXPECT_EQ(orders.size(), 2u);
      }
      if (s == 1 && window == 2) {
        EXPECT_GE(orders.size(), 6u);
      }
    }
  }
}

TEST(MixPlanTest, AStoppingSourceServesOnePassThenNothing) {
  const MixPlan plan = ThreeSources(true, 1);
  EXPECT_THAT(plan.EpochCounts(0), ElementsAre(25, 14, 6));
  EXPECT_THAT(plan.EpochCounts(2), ElementsAre(25, 14, 3));  // 15 = 6+6+3
  EXPECT_THAT(plan.EpochCounts(3), ElementsAre(25, 14, 0));
  std::set<std::pair<int, int64_t>> c;
  for (int64_t e = 0; e < 4; ++e) {
    const int64_t length = 39 + plan.EpochCounts(e)[2];
    for (const auto& [s, shard, sample] : Expand(plan, e, 0, length))
      if (s == 2) {
        EXPECT_TRUE(c.emplace(shard, sample).second);
      }
  }
  EXPECT_EQ(c.size(), 15u);
  EXPECT_EQ(plan.StreamPosition(2, 3, 0),
            std::make_pair(int64_t{0}, int64_t{15}));
}

TEST(MixPlanTest, SharesAndBlocksFromTheSpec) {
  v1::JobSpec spec;
  spec.set_name("m");
  spec.set_samples_per_epoch(1000);
  for (auto [name, w, n] :
       {std::tuple<const char*, double, int64_t>{"a", 0.46, 0},
        {"b", 0.33, 0},
        {"c", 0.21, 0},
        {"d", 0, 100}}) {
    v1::Source* src = spec.add_sources();
    src->set_name(name);
    src->set_weight(w);
    src->set_samples_per_epoch(n);
    for (int s = 0; s < 4; ++s) {
      v1::Shard* shard = src->mutable_manifest()->add_shards();
      shard->set_url(absl::StrCat("/", name, s, ".tar"));
      shard->set_num_samples(50);
    }
  }
  auto normalized = NormalizeJobSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  // 900 over the weights: 414, 297, 189 exactly.
  EXPECT_THAT(SourceShares(*normalized), ElementsAre(414, 297, 189, 100));
  // No windows: one 50-sample shard of "a" per 50 * 1000 / 414 = 120 positions.
  EXPECT_EQ(MixBlockSamples(*normalized, SourceShares(*normalized)), 120);
}

// A unit whose source repeats within it: each pass's segment has its own
// augmentation key, so a sample served again is cropped anew.
TEST(MixPlanTest, EachPassOfASourceHasItsOwnAugmentationKey) {
  v1::JobSpec spec;
  spec.set_name("m");
  spec.set_seed(4);
  for (auto [name, n] :
       {std::pair<const char*, int64_t>{"small", 12}, {"large", 12}}) {
    v1::Source* src = spec.add_sources();
    src->set_name(name);
    src->set_samples_per_epoch(n);
    const int shards = std::string(name) == "small" ? 1 : 3;
    for (int s = 0; s < shards; ++s) {
      v1::Shard* shard = src->mutable_manifest()->add_shards();
      shard->set_url(absl::StrCat("/", name, s, ".tar"));
      shard->set_num_samples(std::string(name) == "small" ? 4 : 10);
    }
  }
  auto normalized = NormalizeJobSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  auto plan = MixPlanFromSpec(*normalized, PlanOptions{});
  v1::MixedUnit unit;
  MixUnitToProto(*plan, *normalized, 0, 0, 24, &unit);
  std::map<std::pair<int, uint64_t>, int> keys;  // (source, key) -> segments
  for (const v1::MixSegment& seg : unit.segments())
    ++keys[{seg.source(), seg.augment_seed()}];
  // "small" (4 samples, 12 per epoch): three passes, three keys.
  int small_keys = 0;
  for (const auto& [k, n] : keys) {
    if (k.first != 0) continue;
    ++small_keys;
    EXPECT_EQ(n, 1);
  }
  EXPECT_EQ(small_keys, 3);
  EXPECT_NE(plan->AugmentSeed(0, 0), plan->AugmentSeed(1, 0));
  EXPECT_THAT(unit.mix_samples(), ElementsAre(12, 12));
  EXPECT_EQ(unit.segments(0).source_name(), "small");
}

}  // namespace
}  // namespace sluice
