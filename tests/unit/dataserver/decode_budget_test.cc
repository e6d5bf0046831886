#include "server/dataserver/decode_budget.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::dataserver {
namespace {

using ::testing::ElementsAre;

TEST(DecodeMemoryBudgetTest, GrantsInTheOrderAskedWithinTheCapacity) {
  DecodeMemoryBudget budget(100);
  std::vector<int> granted;
  budget.Reserve(60, [&] { granted.push_back(1); });
  budget.Reserve(30, [&] { granted.push_back(2); });
  budget.Reserve(20, [&] { granted.push_back(3); });  // 110 > 100: waits
  budget.Reserve(5, [&] { granted.push_back(4); });  // fits, but waits behind 3
  EXPECT_THAT(granted, ElementsAre(1, 2));
  EXPECT_EQ(budget.in_use(), 90);
  EXPECT_EQ(budget.waits(), 2);
  budget.Release(30);  // 60 + 20 + 5 fit
  EXPECT_THAT(granted, ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(budget.in_use(), 85);
  EXPECT_EQ(budget.peak(), 90);
}

TEST(DecodeMemoryBudgetTest, AnOversizedRequestRunsAlone) {
  DecodeMemoryBudget budget(100);
  std::vector<int> granted;
  budget.Reserve(10, [&] { granted.push_back(1); });
  budget.Reserve(500,
                 [&] { granted.push_back(2); });  // waits until nothing is held
  budget.Reserve(10, [&] { granted.push_back(3); });
  EXPECT_THAT(granted, ElementsAre(1));
  budget.Release(10);
  EXPECT_THAT(granted, ElementsAre(1, 2));
  EXPECT_EQ(budget.in_use(), 500);
  budget.Release(500);
  EXPECT_THAT(granted, ElementsAre(1, 2, 3));
}

TEST(DecodeMemoryBudgetTest, ACallbackMayReleaseAndReserveAgain) {
  // Callbacks run outside the budget's lock: one that gives its memory
  // straight back (a cancelled stream's sample) and asks again is fine.
  DecodeMemoryBudget budget(10);
  int runs = 0;
  budget.Reserve(10, [&] { ++runs; });
  budget.Reserve(10, [&] {
    ++runs;
    budget.Release(10);
    budget.Reserve(10, [&] { ++runs; });
  });
  budget.Release(10);
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(budget.in_use(), 10);
}

TEST(DecodeMemoryBudgetTest, NoCapacityMeansNoBound) {
  DecodeMemoryBudget budget(0);
  int runs = 0;
  for (int i = 0; i < 5; ++i) budget.Reserve(int64_t{1} << 40, [&] { ++runs; });
  EXPECT_EQ(runs, 5);
  EXPECT_EQ(budget.waits(), 0);
}

}  // namespace
}  // namespace sluice::dataserver
