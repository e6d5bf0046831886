#include "server/common/mix_order.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace sluice {
namespace {

using ::testing::ElementsAre;

TEST(MixOrderTest, GoldenSequences) {
  // From an independent implementation of the rule in mix_order.h (exact
  // fractions sorted in Python), not from this code.
  EXPECT_THAT(MixSources({5, 3, 2}, 0, 10),
              ElementsAre(0, 1, 0, 2, 0, 1, 0, 0, 1, 2));
  EXPECT_THAT(MixSources({3, 0, 4, 1}, 0, 8),
              ElementsAre(0, 2, 0, 2, 2, 0, 3, 2));
}

TEST(MixOrderTest, ApportionIsLargestRemainder) {
  EXPECT_THAT(Apportion(10, {0.5, 0.3, 0.2}), ElementsAre(5, 3, 2));
  // 7 * (1/3) = 2.33 each: one left over, to the first.
  EXPECT_THAT(Apportion(7, {1, 1, 1}), ElementsAre(3, 2, 2));
  // Remainders .6, .3, .1 (of 10 * {0.46, 0.33, 0.21}): 4.6 -> 5.
  EXPECT_THAT(Apportion(10, {0.46, 0.33, 0.21}), ElementsAre(5, 3, 2));
  // Weights need not sum to 1.
  EXPECT_THAT(Apportion(1000, {7, 1, 2}), ElementsAre(700, 100, 200));
  EXPECT_THAT(Apportion(0, {1, 2}), ElementsAre(0, 0));
  const std::vector<int64_t> big = Apportion(int64_t{1} << 50, {1, 1, 1});
  EXPECT_EQ(big[0] + big[1] + big[2], int64_t{1} << 50);
  // Extreme weights neither overflow nor stall.
  EXPECT_THAT(Apportion(1000, {1e308, 1e308}), ElementsAre(500, 500));
  EXPECT_THAT(Apportion(1000, {1e-300, 1}), ElementsAre(0, 1000));
}

TEST(MixOrderTest, CountBeforeMatchesTheSequenceEverywhere) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int k = 1 + static_cast<int>(rng() % 6);
    std::vector<int64_t> counts(k);
    for (auto& c : counts) c = static_cast<int64_t>(rng() % 40);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), 0L);
    const std::vector<int32_t> all = MixSources(counts, 0, total);
    ASSERT_EQ(static_cast<int64_t>(all.size()), total);
    std::vector<int64_t> seen(k, 0);
    for (int64_t p = 0; p <= total; ++p) {
      for (int s = 0; s < k; ++s)
        ASSERT_EQ(MixCountBefore(counts, s, p), seen[s])
            << "trial " << trial << " position " << p << " source " << s;
      if (p < total) ++seen[all[p]];
      // Any stretch starts where the whole sequence has it.
      if (p % 7 == 0) {
        const std::vector<int32_t> tail = MixSources(counts, p, total);
        ASSERT_TRUE(std::equal(tail.begin(), tail.end(), all.begin() + p));
      }
    }
    for (int s = 0; s < k; ++s) EXPECT_EQ(seen[s], counts[s]);
  }
}

TEST(MixOrderTest, CountsStayConsistentFarIntoHugeEpochs) {
  const std::vector<int64_t> counts = {int64_t{1} << 40, 3, int64_t{1} << 30,
                                       7'000'000'019};
  const int64_t total = std::accumulate(counts.begin(), counts.end(), 0L);
  for (const int64_t from : {int64_t{0}, total / 3, total - 300}) {
    std::vector<int64_t> n = MixCountsBefore(counts, from);
    ASSERT_EQ(std::accumulate(n.begin(), n.end(), 0L), from);
    const std::vector<int32_t> next = MixSourcesFrom(counts, n, 300);
    for (int64_t p = 0; p < static_cast<int64_t>(next.size()); ++p) {
      ++n[next[static_cast<size_t>(p)]];
      ASSERT_EQ(MixCountsBefore(counts, from + p + 1), n) << from + p + 1;
    }
  }
}

// The largest |count - W * share| of `source` over all stretches of at most
// `span` positions.
double WorstDeviation(const std::vector<int32_t>& seq, int32_t source,
                      double share, int64_t span) {
  std::vector<int64_t> prefix(seq.size() + 1, 0);
  for (size_t p = 0; p < seq.size(); ++p)
    prefix[p + 1] = prefix[p] + (seq[p] == source ? 1 : 0);
  double worst = 0;
  for (size_t a = 0; a < seq.size(); ++a) {
    for (size_t b = a + 1; b <= std::min(seq.size(), a + span); ++b) {
      const double d = std::abs(static_cast<double>(prefix[b] - prefix[a]) -
                                static_cast<double>(b - a) * share);
      worst = std::max(worst, d);
    }
  }
  return worst;
}

TEST(MixOrderTest, EveryStretchKeepsTheStatedBound) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 30; ++trial) {
    const int k = 2 + static_cast<int>(rng() % 5);
    std::vector<int64_t> counts(k);
    for (auto& c : counts) c = 1 + static_cast<int64_t>(rng() % 80);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), 0L);
    const std::vector<int32_t> seq = MixSources(counts, 0, total);
    for (int s = 0; s < k; ++s) {
      const double share = static_cast<double>(counts[s]) / total;
      EXPECT_LT(WorstDeviation(seq, s, share, 128), 1 + (k - 2) * share)
          << "trial " << trial << " source " << s;
    }
  }
}

TEST(MixOrderTest, HalfThirdFifthStaysWithinOneInEveryStretch) {
  const std::vector<int64_t> counts = {500, 300, 200};
  const std::vector<int32_t> seq = MixSources(counts, 0, 1000);
  EXPECT_LE(WorstDeviation(seq, 0, 0.5, 256), 1.0 + 1e-9);
  EXPECT_LE(WorstDeviation(seq, 1, 0.3, 256), 1.0 + 1e-9);
  EXPECT_LE(WorstDeviation(seq, 2, 0.2, 256), 1.0 + 1e-9);
}

TEST(MixOrderTest, EqualSourcesAlternate) {
  EXPECT_THAT(MixSources({3, 3, 3}, 0, 9),
              ElementsAre(0, 1, 2, 0, 1, 2, 0, 1, 2));
}

}  // namespace
}  // namespace sluice
