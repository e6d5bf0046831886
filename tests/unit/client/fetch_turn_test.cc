#include "client/cpp/fetch_turn.h"

#include <gtest/gtest.h>

namespace sluice::client_internal {
namespace {

FetchTurnView Held(int64_t order, std::string_view server, int64_t remaining,
                   int64_t last_batch) {
  return FetchTurnView{order, server, true, remaining, last_batch};
}
FetchTurnView Next(int64_t order, std::string_view server) {
  return FetchTurnView{order, server, false, 0, 0};
}

TEST(FetchTurnTest, TheFirstUnitStartsAtOnce) {
  const FetchTurnView first = Next(0, "a:1");
  EXPECT_TRUE(FetchMayStart(first, {first}));
}

TEST(FetchTurnTest, WaitsForAnEarlierStreamToTheSameServerToStart) {
  // The earlier unit has received nothing yet.
  EXPECT_FALSE(FetchMayStart(Next(1, "a:1"), {Held(0, "a:1", 100, 0)}));
}

TEST(FetchTurnTest, OpensWhenTheEarlierStreamsNextBatchIsProbablyItsLast) {
  EXPECT_FALSE(FetchMayStart(Next(1, "a:1"), {Held(0, "a:1", 33, 32)}));
  EXPECT_TRUE(FetchMayStart(Next(1, "a:1"), {Held(0, "a:1", 32, 32)}));
  EXPECT_TRUE(FetchMayStart(Next(1, "a:1"), {Held(0, "a:1", 0, 32)}));
}

TEST(FetchTurnTest, OtherServersStreamInParallel) {
  EXPECT_TRUE(FetchMayStart(Next(1, "b:1"), {Held(0, "a:1", 100, 0)}));
}

TEST(FetchTurnTest, LaterUnitsNeverHoldUpEarlierOnes) {
  EXPECT_TRUE(FetchMayStart(Next(0, "a:1"), {Held(1, "a:1", 100, 0)}));
}

TEST(FetchTurnTest, AStreamNoLongerFetchingDoesNotCount) {
  FetchTurnView finished = Held(0, "a:1", 100, 0);
  finished.streaming = false;  // done, failed, dropped or awaiting re-route
  EXPECT_TRUE(FetchMayStart(Next(1, "a:1"), {finished}));
}

TEST(FetchTurnTest, EveryEarlierStreamToTheServerMustBeNearItsEnd) {
  const std::vector<FetchTurnView> held = {Held(0, "a:1", 10, 32),
                                           Held(1, "a:1", 100, 32)};
  EXPECT_FALSE(FetchMayStart(Next(2, "a:1"), held));
  EXPECT_TRUE(FetchMayStart(Next(1, "a:1"), held));
}

}  // namespace
}  // namespace sluice::client_internal
