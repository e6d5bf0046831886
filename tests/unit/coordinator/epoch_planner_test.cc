#include "server/coordinator/epoch_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <tuple>

namespace sluice {
namespace {

using ::testing::ElementsAre;

TEST(ShardOrderTest, WithoutShuffleIsManifestOrder) {
  EXPECT_THAT(ShardOrder(5, 123, 7, false), ElementsAre(0, 1, 2, 3, 4));
}

TEST(ShardOrderTest, SplitMix64MatchesTheReferenceOutput) {
  // Reference values of SplitMix64 (Vigna) seeded with 0: the first outputs
  // are Mix(0x9E3779B97F4A7C15 * k). This pins Mix() to the published
  // generator.
  EXPECT_EQ(SplitMix64::Mix(0x9E3779B97F4A7C15ULL), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(SplitMix64::Mix(0x9E3779B97F4A7C15ULL * 2), 0x6E789E6AA1B965F4ULL);
}

TEST(ShardOrderTest, GoldenOrderIsStable) {
  // Pinned so that a change of the documented algorithm (or a platform
  // difference) fails loudly: plans must be reproducible across versions.
  // Computed by an independent implementation of the spec in
  // epoch_planner.h (a few lines of Python), not by this code.
  EXPECT_THAT(ShardOrder(10, 42, 0, true),
              ElementsAre(6, 9, 0, 7, 1, 3, 8, 4, 5, 2));
}

TEST(ShardOrderTest, IsAPermutationThatDependsOnSeedAndEpoch) {
  const auto a = ShardOrder(1000, 7, 0, true);
  const auto b = ShardOrder(1000, 7, 1, true);
  const auto c = ShardOrder(1000, 8, 0, true);
  EXPECT_EQ(a, ShardOrder(1000, 7, 0, true));
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  std::vector<int32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
}

TEST(PlanEpochTest, DropGivesEqualQuotasAndDropsTheTail) {
  PlanOptions options;
  options.world_size = 3;
  const EpochPlan plan = PlanEpoch({4, 3, 3}, options, 0);  // T = 10
  EXPECT_EQ(plan.total_samples, 10);
  EXPECT_EQ(plan.samples_per_rank, 3);
  EXPECT_EQ(plan.dropped, 1);
  ASSERT_EQ(plan.rank_begin, (std::vector<int64_t>{0, 1, 3, 5}));
  EXPECT_THAT(
      plan.units,
      ElementsAre(PlannedUnit{0, 0, 3, 0, 0, 0}, PlannedUnit{0, 3, 4, 1, 1, 1},
                  PlannedUnit{1, 0, 2, 2, 1, 1}, PlannedUnit{1, 2, 3, 3, 2, 2},
                  PlannedUnit{2, 0, 2, 4, 2, 2}));
}

TEST(PlanEpochTest, WorkersSplitEachRankIntoSlotsOfEqualSizesOnEveryRank) {
  PlanOptions options;
  options.world_size = 2;
  options.workers_per_rank = 3;
  const EpochPlan plan =
      PlanEpoch({7, 4}, options, 0);  // T = 11, q = 5, 1 dropped
  EXPECT_EQ(plan.samples_per_rank, 5);
  EXPECT_EQ(plan.dropped, 1);
  ASSERT_EQ(plan.num_slots(), 6);
  // Slots of 2, 2, 1 samples on both ranks; a unit never spans two slots.
  EXPECT_THAT(
      plan.units,
      ElementsAre(PlannedUnit{0, 0, 2, 0, 0, 0}, PlannedUnit{0, 2, 4, 1, 0, 1},
                  PlannedUnit{0, 4, 5, 2, 0, 2}, PlannedUnit{0, 5, 7, 3, 1, 3},
                  PlannedUnit{1, 0, 2, 4, 1, 4},
                  PlannedUnit{1, 2, 3, 5, 1, 5}));
  for (int32_t slot = 0; slot < plan.num_slots(); ++slot) {
    EXPECT_EQ(plan.slot_quota(slot), slot % 3 == 2 ? 1 : 2) << slot;
    EXPECT_EQ(plan.RankOfSlot(slot), slot / 3);
  }
  // More workers than samples: the last slots are empty.
  options.workers_per_rank = 4;
  const EpochPlan small = PlanEpoch({3}, options, 0);  // q = 1
  EXPECT_EQ(small.slot_quota(0), 1);
  EXPECT_EQ(small.slot_quota(1), 0);
  EXPECT_EQ(small.units.size(), 2u);
}

TEST(PlanEpochTest, PadRepeatsTheFirstSamples) {
  PlanOptions options;
  options.world_size = 4;
  options.remainder = RemainderPolicy::kPad;
  const EpochPlan plan = PlanEpoch({5}, options, 0);  // T = 5, q = 2, 3 padded
  EXPECT_EQ(plan.samples_per_rank, 2);
  EXPECT_EQ(plan.padded, 3);
  EXPECT_THAT(
      plan.units,
      ElementsAre(PlannedUnit{0, 0, 2, 0, 0, 0}, PlannedUnit{0, 2, 4, 1, 1, 1},
                  PlannedUnit{0, 4, 5, 2, 2, 2}, PlannedUnit{0, 0, 1, 3, 2, 2},
                  PlannedUnit{0, 1, 3, 4, 3, 3}));
}

TEST(PlanEpochTest, MaxSamplesPerLeaseCutsUnits) {
  PlanOptions options;
  options.max_samples_per_lease = 4;
  const EpochPlan plan = PlanEpoch({10}, options, 0);
  EXPECT_THAT(plan.units, ElementsAre(PlannedUnit{0, 0, 4, 0, 0},
                                      PlannedUnit{0, 4, 8, 1, 0},
                                      PlannedUnit{0, 8, 10, 2, 0}));
}

TEST(PlanEpochTest, EmptyDatasetHasNoUnits) {
  PlanOptions options;
  options.world_size = 2;
  const EpochPlan plan = PlanEpoch({0, 0}, options, 0);
  EXPECT_EQ(plan.samples_per_rank, 0);
  EXPECT_TRUE(plan.units.empty());
}

// Property test over thousands of combinations: every rank gets exactly q
// samples, units are in bounds and below the lease limit, and (DROP) the
// served samples are each sample of the dataset at most once, all but exactly
// `dropped` of them; (PAD) every sample at least once, exactly `padded` twice.
TEST(PlanEpochTest, BalanceIsExactForThousandsOfShapes) {
  SplitMix64 rng(2024, 0);
  int cases = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int num_shards = 1 + static_cast<int>(rng.Next() % 40);
    std::vector<int64_t> sizes(num_shards);
    for (auto& s : sizes) {
      const uint64_t kind = rng.Next() % 4;
      s = kind == 0 ? 0 : kind == 1 ? 1 : static_cast<int64_t>(rng.Next() % 50);
    }
    PlanOptions options;
    options.seed = rng.Next();
    options.shuffle = rng.Next() % 2 == 0;
    options.world_size =
        static_cast<int32_t>(rng.Next() % 70);  // often > shards
    options.remainder =
        rng.Next() % 2 == 0 ? RemainderPolicy::kDrop : RemainderPolicy::kPad;
    options.max_samples_per_lease = static_cast<int64_t>(rng.Next() % 8);
    const int64_t epoch = static_cast<int64_t>(rng.Next() % 5);
    const EpochPlan plan = PlanEpoch(sizes, options, epoch);
    const int64_t total =
        std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " W="
                                      << options.world_size << " T=" << total);
    ASSERT_EQ(plan.total_samples, total);
    const int64_t w = std::max(options.world_size, 1);
    std::map<std::pair<int32_t, int64_t>, int> seen;
    for (int32_t r = 0; r < plan.num_ranks; ++r) {
      int64_t got = 0;
      for (int64_t i = plan.rank_begin[r]; i < plan.rank_begin[r + 1]; ++i) {
        const PlannedUnit& u = plan.units[i];
        ASSERT_EQ(u.rank, r);
        ASSERT_EQ(u.sequence, i);
        ASSERT_GT(u.size(), 0);
        ASSERT_GE(u.begin, 0);
        ASSERT_LE(u.end, sizes[u.shard_index]);
        if (options.max_samples_per_lease > 0) {
          ASSERT_LE(u.size(), options.max_samples_per_lease);
        }
        for (int64_t k = u.begin; k < u.end; ++k) ++seen[{u.shard_index, k}];
        got += u.size();
      }
      ASSERT_EQ(got, plan.samples_per_rank);
    }
    if (options.world_size == 0) {
      ASSERT_EQ(plan.samples_per_rank, total);
    } else if (options.remainder == RemainderPolicy::kDrop) {
      ASSERT_EQ(plan.samples_per_rank, total / w);
      ASSERT_EQ(static_cast<int64_t>(seen.size()), total - plan.dropped);
      for (const auto& [key, count] : seen) ASSERT_EQ(count, 1);
    } else {
      ASSERT_EQ(plan.samples_per_rank, (total + w - 1) / w);
      ASSERT_EQ(static_cast<int64_t>(seen.size()), total);
      int64_t extra = 0;
      for (const auto& [key, count] : seen) extra += count - 1;
      ASSERT_EQ(extra, plan.padded);
    }
    ASSERT_EQ(plan.units.size(), PlanEpoch(sizes, options, epoch).units.size());
    ++cases;
  }
  EXPECT_EQ(cases, 3000);
}

TEST(PlanEpochTest, SameInputsGiveTheSamePlan) {
  PlanOptions options;
  options.seed = 99;
  options.shuffle = true;
  options.world_size = 7;
  options.max_samples_per_lease = 3;
  std::vector<int64_t> sizes;
  for (int i = 0; i < 200; ++i) sizes.push_back(i % 13);
  EXPECT_EQ(PlanEpoch(sizes, options, 4).units,
            PlanEpoch(sizes, options, 4).units);
  EXPECT_NE(PlanEpoch(sizes, options, 4).units,
            PlanEpoch(sizes, options, 5).units);
}

// PlanSequence cuts explicit ranges (a resume's unconsumed samples) like
// PlanEpoch cuts whole shards: in order, balanced, PAD wrapping around.
TEST(PlanSequenceTest, CutsExplicitRangesInOrder) {
  PlanOptions options;
  options.world_size = 2;
  options.remainder = RemainderPolicy::kPad;
  options.max_samples_per_lease = 2;
  const std::vector<SampleRange> ranges = {
      {3, 4, 7}, {0, 0, 0}, {1, 10, 12}};  // 5 samples
  const EpochPlan plan = PlanSequence(ranges, options, 7);
  EXPECT_EQ(plan.epoch, 7);
  EXPECT_EQ(plan.samples_per_rank, 3);
  EXPECT_EQ(plan.padded, 1);
  std::vector<std::tuple<int32_t, int64_t, int64_t, int32_t>> units;
  for (const PlannedUnit& u : plan.units)
    units.emplace_back(u.shard_index, u.begin, u.end, u.rank);
  const std::vector<std::tuple<int32_t, int64_t, int64_t, int32_t>> want = {
      {3, 4, 6, 0}, {3, 6, 7, 0}, {1, 10, 12, 1}, {3, 4, 5, 1}};
  EXPECT_EQ(units, want);
}

TEST(PlanWindowsTest, GroupsTheShuffledShardsIntoWindows) {
  PlanOptions options;
  options.shuffle = true;
  options.seed = 42;
  options.shuffle_window = 3;
  const std::vector<int64_t> sizes = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  const std::vector<ShuffleWindow> windows = PlanWindows(sizes, options, 0);
  // 10 shards, at least 3 per window: 3 windows of 3, 3 and 4 shards, in
  // the epoch's shard order.
  ASSERT_EQ(windows.size(), 3u);
  std::vector<int32_t> shards;
  for (size_t w = 0; w < windows.size(); ++w) {
    int64_t samples = 0;
    for (int32_t s : windows[w].shards) samples += sizes[s];
    EXPECT_EQ(windows[w].samples, samples);
    EXPECT_EQ(windows[w].order_seed, WindowOrderSeed(42, 0, w));
    shards.insert(shards.end(), windows[w].shards.begin(),
                  windows[w].shards.end());
  }
  EXPECT_EQ(windows[0].shards.size(), 3u);
  EXPECT_EQ(windows[2].shards.size(), 4u);
  EXPECT_EQ(shards, ShardOrder(10, 42, 0, true));
}

TEST(PlanWindowsTest, NoWindowsWithoutShuffleOrWithWindowOne) {
  PlanOptions options;
  options.shuffle_window = 8;
  EXPECT_TRUE(PlanWindows({1, 2, 3}, options, 0).empty());
  options.shuffle = true;
  options.shuffle_window = 1;
  EXPECT_TRUE(PlanWindows({1, 2, 3}, options, 0).empty());
  // And then the plan is the shard-level one.
  PlanOptions shards = options;
  shards.shuffle_window = 0;
  EXPECT_EQ(PlanEpoch({1, 2, 3}, options, 4).units,
            PlanEpoch({1, 2, 3}, shards, 4).units);
}

TEST(PlanWindowsTest, EpochPlanCoversEveryWindowPositionOnce) {
  PlanOptions options;
  options.shuffle = true;
  options.seed = 7;
  options.shuffle_window = 4;
  options.world_size = 3;
  options.workers_per_rank = 2;
  options.max_samples_per_lease = 10;
  options.remainder = RemainderPolicy::kPad;
  std::vector<int64_t> sizes;
  for (int i = 0; i < 13; ++i) sizes.push_back(20 + i);
  const std::vector<ShuffleWindow> windows = PlanWindows(sizes, options, 2);
  const EpochPlan plan = PlanEpoch(sizes, options, 2);
  ASSERT_EQ(windows.size(), 3u);
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  EXPECT_EQ(plan.total_samples, total);
  // Units name windows; their positions, in plan order, walk every window
  // from 0 to its end (then PAD wraps around to the start).
  std::vector<std::vector<int64_t>> seen(windows.size());
  for (const PlannedUnit& u : plan.units) {
    ASSERT_GE(u.shard_index, 0);
    ASSERT_LT(u.shard_index, static_cast<int32_t>(windows.size()));
    ASSERT_LE(u.end, windows[u.shard_index].samples);
    ASSERT_LE(u.size(), 10);
    for (int64_t p = u.begin; p < u.end; ++p) seen[u.shard_index].push_back(p);
  }
  int64_t served = 0;
  for (size_t w = 0; w < windows.size(); ++w) {
    for (int64_t p = 0; p < windows[w].samples; ++p)
      ASSERT_EQ(seen[w][p], p) << "window " << w;
    served += static_cast<int64_t>(seen[w].size());
  }
  EXPECT_EQ(served, plan.samples_per_rank * 3);
  EXPECT_EQ(plan.padded, served - total);
}

}  // namespace
}  // namespace sluice
