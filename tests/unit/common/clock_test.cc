#include "server/common/clock.h"

#include <gtest/gtest.h>

#include "tests/testing/fake_clock.h"

namespace sluice {
namespace {

TEST(ClockTest, RealClockTracksWallTime) {
  const absl::Time before = absl::Now();
  const absl::Time t = Clock::Real()->Now();
  const absl::Time after = absl::Now();
  EXPECT_LE(before, t);
  EXPECT_LE(t, after);
  EXPECT_EQ(Clock::Real(), Clock::Real());
}

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  testing::FakeClock clock(absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), absl::FromUnixMillis(101500));
  clock.Set(absl::FromUnixSeconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(5));
}

TEST(FakeClockTest, UsableThroughTheInterface) {
  testing::FakeClock fake;
  Clock* clock = &fake;
  const absl::Time start = clock->Now();
  fake.Advance(absl::Seconds(10));
  EXPECT_EQ(clock->Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace sluice
