#include "client/cpp/report_ledger.h"

#include <gtest/gtest.h>

#include <optional>

namespace sluice::client_internal {
namespace {

v1::TrainerMessage Complete(const std::string& lease) {
  v1::TrainerMessage m;
  m.mutable_complete()->mutable_lease()->set_lease_id(lease);
  return m;
}

// A lease of unit (sequence 0, shard `shard`) of epoch 0, [0, 10).
v1::Lease Lease(const std::string& id, int32_t shard = 0) {
  v1::Lease lease;
  lease.set_lease_id(id);
  lease.mutable_unit()->mutable_shard()->set_shard_index(shard);
  lease.mutable_unit()->set_end(10);
  return lease;
}

std::vector<std::string> Leases(const std::vector<v1::TrainerMessage>& ms) {
  std::vector<std::string> out;
  for (const auto& m : ms) out.push_back(m.complete().lease().lease_id());
  return out;
}

TEST(ReportLedgerTest, SyncIdsIncreaseFromOne) {
  ReportLedger ledger;
  EXPECT_EQ(ledger.last_sync_id(), 0u);
  EXPECT_EQ(ledger.NextSyncId(), 1u);
  EXPECT_EQ(ledger.NextSyncId(), 2u);
  EXPECT_EQ(ledger.last_sync_id(), 2u);
}

TEST(ReportLedgerTest, AReportIsConfirmedOnlyByASyncSentAfterIt) {
  ReportLedger ledger;
  ledger.NextSyncId();  // Sync{1} goes out before the report
  ledger.Sent(Lease("a"), 0, Complete("a"), 0);
  ledger.Synced(1);  // answers a Sync sent before "a": not a confirmation
  EXPECT_EQ(Leases(ledger.Unconfirmed()), std::vector<std::string>{"a"});
  ASSERT_NE(ledger.Find("a"), nullptr);
  EXPECT_EQ(ledger.NextSyncId(), 2u);
  ledger.Synced(2);
  EXPECT_TRUE(ledger.empty());
  EXPECT_EQ(ledger.Find("a"), nullptr);
  EXPECT_EQ(ledger.synced(), 2u);
}

TEST(ReportLedgerTest, ASyncedConfirmsEveryReportBeforeItsSync) {
  ReportLedger ledger;
  ledger.Sent(Lease("a"), 0, Complete("a"), 0);
  ledger.NextSyncId();  // 1
  ledger.Sent(Lease("b"), 0, Complete("b"), 1);
  ledger.NextSyncId();  // 2
  ledger.Sent(Lease("c"), 0, Complete("c"), 2);
  // Synced{2} arrives, Synced{1} was lost with a broken stream.
  ledger.Synced(2);
  EXPECT_EQ(Leases(ledger.Unconfirmed()), std::vector<std::string>{"c"});
}

TEST(ReportLedgerTest, ALateSmallerSyncedChangesNothing) {
  ReportLedger ledger;
  ledger.NextSyncId();
  ledger.NextSyncId();
  ledger.Sent(Lease("a"), 0, Complete("a"), 0);  // after Sync{2}
  ledger.NextSyncId();                           // 3
  ledger.Synced(3);
  ledger.Sent(Lease("b"), 0, Complete("b"), 1);  // after Sync{3}
  ledger.Synced(1);
  EXPECT_EQ(ledger.synced(), 3u);
  EXPECT_EQ(Leases(ledger.Unconfirmed()), std::vector<std::string>{"b"});
}

TEST(ReportLedgerTest, UnconfirmedReportsComeInGrantOrderNotLeaseIdOrder) {
  ReportLedger ledger;
  ledger.Sent(Lease("z"), 0, Complete("z"), 0);
  ledger.Sent(Lease("m"), 0, Complete("m"), 2);
  ledger.Sent(Lease("a"), 0, Complete("a"), 1);
  EXPECT_EQ(Leases(ledger.Unconfirmed()),
            (std::vector<std::string>{"z", "a", "m"}));
}

TEST(ReportLedgerTest, ASecondReportOfALeaseReplacesTheFirst) {
  ReportLedger ledger;
  ledger.Sent(Lease("a"), 0, Complete("a"), 0);
  v1::TrainerMessage release;
  release.mutable_release()->mutable_lease()->set_lease_id("a");
  release.mutable_release()->set_consumed(7);
  ledger.Sent(Lease("a"), 0, release, 0);
  ASSERT_NE(ledger.Find("a"), nullptr);
  EXPECT_EQ(ledger.Find("a")->release().consumed(), 7);
  EXPECT_EQ(ledger.Unconfirmed().size(), 1u);
}

// A paused reader's Complete reached the coordinator after its lease
// expired: the Rejected forgets the report and says it had delivered all.
TEST(ReportLedgerTest, DropForgetsAReportAndSaysWhatItDelivered) {
  ReportLedger ledger;
  ledger.Sent(Lease("a"), 10, Complete("a"), 0);
  EXPECT_FALSE(ledger.Drop("b").has_value());
  std::optional<ReportLedger::Dropped> dropped = ledger.Drop("a");
  ASSERT_TRUE(dropped.has_value());
  EXPECT_EQ(dropped->lease.lease_id(), "a");
  EXPECT_EQ(dropped->delivered, 10);
  EXPECT_TRUE(ledger.empty());
  EXPECT_FALSE(ledger.Drop("a").has_value());
}

// A new grant of the same unit (its Rejected still on the way) forgets the
// other leases' reports of that unit only.
TEST(ReportLedgerTest, DropSameUnitForgetsOnlyOtherLeasesOfThatUnit) {
  ReportLedger ledger;
  ledger.Sent(Lease("a", 1), 10, Complete("a"), 0);
  ledger.Sent(Lease("b", 2), 4, Complete("b"), 1);
  v1::Lease other_epoch = Lease("c", 1);
  other_epoch.set_epoch(1);
  ledger.Sent(other_epoch, 10, Complete("c"), 2);
  const std::vector<ReportLedger::Dropped> dropped =
      ledger.DropSameUnit(Lease("new", 1));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].lease.lease_id(), "a");
  EXPECT_EQ(dropped[0].delivered, 10);
  EXPECT_EQ(Leases(ledger.Unconfirmed()), (std::vector<std::string>{"b", "c"}));
  // A re-announced grant of a reported lease is not a new grant.
  EXPECT_TRUE(ledger.DropSameUnit(Lease("b", 2)).empty());
}

}  // namespace
}  // namespace sluice::client_internal
