#include "client/cpp/reroute_backoff.h"

#include <gtest/gtest.h>

#include <vector>

namespace sluice::client_internal {
namespace {

TEST(RerouteBackoffTest, FirstAtOnceThenDoublingFromInitialToMax) {
  RerouteBackoff backoff;
  std::vector<absl::Duration> waits;
  for (int i = 0; i < 9; ++i) waits.push_back(backoff.Failed("a:1", "s").wait);
  const std::vector<absl::Duration> want = {
      absl::ZeroDuration(),     absl::Milliseconds(50),
      absl::Milliseconds(100),  absl::Milliseconds(200),
      absl::Milliseconds(400),  absl::Milliseconds(800),
      absl::Milliseconds(1600), absl::Seconds(2),
      absl::Seconds(2)};
  EXPECT_EQ(waits, want);
}

TEST(RerouteBackoffTest, AStreamFailingForeverIsRetriedAFewTimesPerMinute) {
  // What a shard no server can serve costs: the first 7 attempts take
  // 3.15 s of back-off together, every later one 2 s.
  RerouteBackoff backoff;
  absl::Duration waited;
  int attempts = 0;
  while (waited < absl::Minutes(1)) {
    waited += backoff.Failed("a:1", "gone.tar").wait;
    ++attempts;
  }
  EXPECT_EQ(attempts, 36);
}

TEST(RerouteBackoffTest, CountsPerServerAndShard) {
  RerouteBackoff backoff;
  backoff.Failed("a:1", "s");
  backoff.Failed("a:1", "s");
  EXPECT_EQ(backoff.Failed("a:1", "t").failures_in_a_row, 1);
  EXPECT_EQ(backoff.Failed("b:1", "s").failures_in_a_row, 1);
  EXPECT_EQ(backoff.Failed("a:1", "s").failures_in_a_row, 3);
}

TEST(RerouteBackoffTest, ABatchEndsTheRun) {
  RerouteBackoff backoff;
  for (int i = 0; i < 5; ++i) backoff.Failed("a:1", "s");
  backoff.Succeeded("a:1", "s");
  const RerouteBackoff::Decision d = backoff.Failed("a:1", "s");
  EXPECT_EQ(d.failures_in_a_row, 1);
  EXPECT_EQ(d.wait, absl::ZeroDuration());
}

TEST(RerouteBackoffTest, LogsTheFirstFailureAndEveryTenth) {
  RerouteBackoff backoff;
  std::vector<int> logged;
  for (int i = 1; i <= 30; ++i) {
    if (backoff.Failed("a:1", "s").log) logged.push_back(i);
  }
  EXPECT_EQ(logged, (std::vector<int>{1, 10, 20, 30}));
}

}  // namespace
}  // namespace sluice::client_internal
