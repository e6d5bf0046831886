#include "client/cpp/lease_hold.h"

#include <gtest/gtest.h>

#include "tests/testing/fake_clock.h"

namespace sluice::client_internal {
namespace {

class LeaseHoldTest : public ::testing::Test {
 protected:
  LeaseHoldTest() { hold_.set_lease_ttl(absl::Seconds(10)); }
  testing::FakeClock clock_;
  LeaseHold hold_{&clock_};
};

TEST_F(LeaseHoldTest, ConnectedDeliversFreely) {
  EXPECT_FALSE(hold_.MayHaveLostLeases());
  clock_.Advance(absl::Hours(1));
  EXPECT_FALSE(hold_.MayHaveLostLeases());
}

TEST_F(LeaseHoldTest, DownForHalfATtlStillDelivers) {
  hold_.Disconnected();
  clock_.Advance(absl::Seconds(5));
  EXPECT_FALSE(hold_.MayHaveLostLeases());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(hold_.MayHaveLostLeases());
}

TEST_F(LeaseHoldTest, ASecondDisconnectDoesNotRestartTheTimer) {
  hold_.Disconnected();
  clock_.Advance(absl::Seconds(4));
  hold_.Disconnected();  // a failed reconnect attempt
  clock_.Advance(absl::Seconds(2));
  EXPECT_TRUE(hold_.MayHaveLostLeases());
}

TEST_F(LeaseHoldTest, AShortBreakNeedsNoConfirmation) {
  hold_.Disconnected();
  clock_.Advance(absl::Seconds(3));
  hold_.Reconnected(/*sync_id=*/7);
  EXPECT_FALSE(hold_.MayHaveLostLeases());
  clock_.Advance(absl::Seconds(30));  // the old break is forgotten
  EXPECT_FALSE(hold_.MayHaveLostLeases());
}

TEST_F(LeaseHoldTest, ALongBreakHoldsUntilTheSyncAfterTheReportsIsAnswered) {
  hold_.Disconnected();
  clock_.Advance(absl::Seconds(6));
  hold_.Reconnected(/*sync_id=*/7);
  EXPECT_TRUE(hold_.MayHaveLostLeases());
  hold_.Synced(6);  // a Sync sent before the re-reports
  EXPECT_TRUE(hold_.MayHaveLostLeases());
  hold_.Synced(7);
  EXPECT_FALSE(hold_.MayHaveLostLeases());
}

TEST_F(LeaseHoldTest, AReconnectWhoseSyncWasNotSentKeepsHolding) {
  hold_.Disconnected();
  clock_.Advance(absl::Seconds(6));
  hold_.Reconnected(/*sync_id=*/0);  // the stream broke again at once
  EXPECT_TRUE(hold_.MayHaveLostLeases());
  hold_.Synced(100);
  EXPECT_TRUE(hold_.MayHaveLostLeases()) << "still down since the first break";
}

// The stream never broke, but this process or the coordinator was paused:
// after 3/4 of a TTL since the send time of the newest confirmed renewal
// nothing is delivered until a newer one is confirmed.
TEST_F(LeaseHoldTest, ASilentStreamHoldsAfterThreeQuartersOfATtl) {
  hold_.HelloSent();
  clock_.Advance(absl::Milliseconds(10));
  hold_.Welcomed();
  clock_.Advance(absl::Milliseconds(7500 - 10));
  EXPECT_FALSE(hold_.MayHaveLostLeases());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(hold_.MayHaveLostLeases());
  hold_.SyncSent(1);
  clock_.Advance(absl::Milliseconds(20));
  hold_.Synced(1);
  EXPECT_FALSE(hold_.MayHaveLostLeases());
  clock_.Advance(absl::Milliseconds(7500 - 20));
  EXPECT_FALSE(hold_.MayHaveLostLeases());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(hold_.MayHaveLostLeases());
}

TEST_F(LeaseHoldTest, OnlyTheSendTimeOfAConfirmedSyncCounts) {
  hold_.HelloSent();
  hold_.Welcomed();
  hold_.SyncSent(1);
  clock_.Advance(absl::Seconds(9));  // paused with Sync 1 unanswered
  hold_.SyncSent(2);
  hold_.Synced(1);  // its renewal dates from before the pause
  EXPECT_TRUE(hold_.MayHaveLostLeases());
  hold_.Synced(2);
  EXPECT_FALSE(hold_.MayHaveLostLeases());
}

TEST_F(LeaseHoldTest, TheTtlComesFromTheWelcome) {
  hold_.set_lease_ttl(absl::Seconds(2));
  hold_.Disconnected();
  clock_.Advance(absl::Milliseconds(1001));
  EXPECT_TRUE(hold_.MayHaveLostLeases());
}

}  // namespace
}  // namespace sluice::client_internal
