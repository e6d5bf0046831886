#include "server/common/shuffle_window.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

namespace sluice {
namespace {

using ::testing::ElementsAre;

TEST(ShuffleWindowTest, GoldenLabelsAreStable) {
  // Computed by an independent implementation of the spec in
  // shuffle_window.h (a few lines of Python), not by this code.
  EXPECT_EQ(WindowOrderSeed(42, 3, 1), 0x2ba128735370b3fdULL);
  EXPECT_THAT(WindowLabels({3, 2, 4}, WindowOrderSeed(42, 3, 1)),
              ElementsAre(0, 0, 2, 2, 1, 2, 0, 2, 1));
}

TEST(ShuffleWindowTest, LabelsHoldEveryPieceItsSampleCount) {
  const std::vector<int64_t> sizes = {100, 0, 7, 250, 1};
  const std::vector<uint16_t> labels = WindowLabels(sizes, 99);
  ASSERT_EQ(labels.size(), 358u);
  std::map<uint16_t, int64_t> count;
  for (uint16_t l : labels) ++count[l];
  EXPECT_EQ(count[0], 100);
  EXPECT_EQ(count.count(1), 0u);
  EXPECT_EQ(count[2], 7);
  EXPECT_EQ(count[3], 250);
  EXPECT_EQ(count[4], 1);
}

TEST(ShuffleWindowTest, LabelsDependOnTheSeedOnly) {
  const std::vector<int64_t> sizes(20, 50);
  EXPECT_EQ(WindowLabels(sizes, 1), WindowLabels(sizes, 1));
  EXPECT_NE(WindowLabels(sizes, 1), WindowLabels(sizes, 2));
  EXPECT_NE(WindowOrderSeed(0, 0, 0), WindowOrderSeed(0, 1, 0));
  EXPECT_NE(WindowOrderSeed(0, 0, 0), WindowOrderSeed(0, 0, 1));
  EXPECT_NE(WindowOrderSeed(0, 0, 0), WindowOrderSeed(1, 0, 0));
}

TEST(ShuffleWindowTest, ConsecutivePositionsMixThePieces) {
  // 20 equal pieces: a run of 64 positions holds about
  // 20 * (1 - (19/20)^64) = 19.25 distinct pieces.
  const std::vector<int64_t> sizes(20, 640);
  const std::vector<uint16_t> labels = WindowLabels(sizes, 5);
  double distinct = 0;
  const size_t batches = labels.size() / 64;
  for (size_t b = 0; b < batches; ++b) {
    std::set<uint16_t> seen(labels.begin() + b * 64,
                            labels.begin() + (b + 1) * 64);
    distinct += static_cast<double>(seen.size());
  }
  EXPECT_GE(distinct / static_cast<double>(batches), 18.5);
}

TEST(ShuffleWindowTest, BoundsGroupAtLeastTheWindowPerWindow) {
  EXPECT_THAT(WindowBounds(20, 32), ElementsAre(0, 20));
  EXPECT_THAT(WindowBounds(63, 32), ElementsAre(0, 63));
  EXPECT_THAT(WindowBounds(64, 32), ElementsAre(0, 32, 64));
  EXPECT_THAT(WindowBounds(70, 32), ElementsAre(0, 35, 70));
  EXPECT_THAT(WindowBounds(10, 3), ElementsAre(0, 3, 6, 10));
  EXPECT_THAT(WindowBounds(3, 1), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(WindowBounds(3, 0), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(WindowBounds(0, 32), ElementsAre(0));
}

}  // namespace
}  // namespace sluice
