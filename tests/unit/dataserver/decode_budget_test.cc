#include "server/dataserver/decode_budget.h"

#include <string>
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

// A job that has filled the budget and queued more does not hold back a
// job that asks later: freed memory goes to the flow holding the least.
TEST(DecodeMemoryBudgetTest, FreedMemoryGoesToTheJobHoldingTheLeast) {
  DecodeMemoryBudget budget(100);
  std::vector<std::string> granted;
  for (int i = 0; i < 12; ++i)
    budget.Reserve("greedy", 1, 10, [&] { granted.push_back("g"); });
  budget.Reserve("light", 1, 10, [&] { granted.push_back("l"); });
  EXPECT_EQ(granted.size(), 10u);  // the greedy job's first 100
  budget.Release("greedy", 10);
  EXPECT_EQ(granted.back(), "l");  // before the greedy job's 11th
  budget.Release("greedy", 10);
  EXPECT_EQ(granted.back(), "g");
  EXPECT_EQ(granted.size(), 12u);
  EXPECT_EQ(budget.in_use(), 100);
}

// Weights 3 and 1 waiting together get the memory 3 : 1, each flow in the
// order it asked; a flow whose next request does not fit holds the others
// back until it does (it is not overtaken for ever).
TEST(DecodeMemoryBudgetTest, WaitingJobsShareTheMemoryByWeight) {
  DecodeMemoryBudget budget(120);
  std::vector<int> heavy, light;
  budget.Reserve("filler", 1, 120, [] {});
  for (int i = 0; i < 20; ++i) {
    budget.Reserve("heavy", 3, 10, [&heavy, i] { heavy.push_back(i); });
    budget.Reserve("light", 1, 10, [&light, i] { light.push_back(i); });
  }
  EXPECT_TRUE(heavy.empty() && light.empty());
  budget.Release("filler", 120);
  EXPECT_EQ(heavy.size(), 9u);
  EXPECT_EQ(light.size(), 3u);
  for (size_t i = 0; i < heavy.size(); ++i) EXPECT_EQ(heavy[i], i);
  for (size_t i = 0; i < light.size(); ++i) EXPECT_EQ(light[i], i);

  // The light flow, holding the least, asks for more than is free: it
  // waits, and so does everything behind it.
  DecodeMemoryBudget big(100);
  std::vector<std::string> order;
  big.Reserve("a", 1, 60, [&] { order.push_back("a60"); });
  big.Reserve("a", 1, 30, [&] { order.push_back("a30"); });
  big.Reserve("b", 1, 50, [&] { order.push_back("b50"); });  // 140 > 100
  big.Reserve("a", 1, 5, [&] { order.push_back("a5"); });
  EXPECT_THAT(order, ElementsAre("a60", "a30"));
  big.Release("a", 30);  // 60 + 50 > 100: b still waits, a5 behind it
  EXPECT_THAT(order, ElementsAre("a60", "a30"));
  big.Release("a", 60);
  EXPECT_THAT(order, ElementsAre("a60", "a30", "b50", "a5"));
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
