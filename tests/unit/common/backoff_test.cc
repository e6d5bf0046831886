#include "server/common/backoff.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

constexpr absl::Duration kInitial = absl::Milliseconds(100);
constexpr absl::Duration kMax = absl::Seconds(5);

TEST(BackoffTest, EachWaitIsJitteredWithinHalfToAllOfADoublingStep) {
  Backoff b(kInitial, kMax, /*seed=*/7);
  absl::Duration step = kInitial;
  for (int i = 0; i < 12; ++i) {
    ASSERT_EQ(b.step(), step) << i;
    const absl::Duration wait = b.NextWait();
    EXPECT_GE(wait, step / 2) << i;
    EXPECT_LE(wait, step) << i;
    step = std::min(step * 2, kMax);
  }
  EXPECT_EQ(b.step(), kMax);
}

TEST(BackoffTest, WaitsAreJitteredNotEqual) {
  Backoff a(kInitial, kInitial, /*seed=*/1);
  absl::Duration first = a.NextWait();
  int different = 0;
  for (int i = 0; i < 20; ++i) different += a.NextWait() != first;
  EXPECT_GT(different, 15);
}

TEST(BackoffTest, ResetStartsOverAndAMaxCapsTheStepAtOnce) {
  Backoff b(kInitial, kMax, /*seed=*/3);
  for (int i = 0; i < 5; ++i) b.Grow();
  EXPECT_EQ(b.step(), absl::Milliseconds(3200));
  b.set_max(absl::Milliseconds(250));
  EXPECT_EQ(b.step(), absl::Milliseconds(250));
  b.Reset();
  EXPECT_EQ(b.step(), kInitial);
  b.set_max(absl::Milliseconds(10));  // never below the initial step
  b.Grow();
  EXPECT_EQ(b.step(), kInitial);
}

TEST(BackoffTest, NthDoublesFromInitialUpToMax) {
  const absl::Duration base = absl::Milliseconds(50);
  EXPECT_EQ(Backoff::Nth(base, absl::Seconds(2), 0), base);
  EXPECT_EQ(Backoff::Nth(base, absl::Seconds(2), 1), base);
  EXPECT_EQ(Backoff::Nth(base, absl::Seconds(2), 2), absl::Milliseconds(100));
  EXPECT_EQ(Backoff::Nth(base, absl::Seconds(2), 6), absl::Milliseconds(1600));
  EXPECT_EQ(Backoff::Nth(base, absl::Seconds(2), 7), absl::Seconds(2));
  EXPECT_EQ(Backoff::Nth(base, absl::Seconds(2), 1000), absl::Seconds(2));
}

}  // namespace
}  // namespace sluice
