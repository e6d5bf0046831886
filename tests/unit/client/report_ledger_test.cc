#include "client/cpp/report_ledger.h"

#include <gtest/gtest.h>

namespace sluice::client_internal {
namespace {

v1::TrainerMessage Complete(const std::string& lease) {
  v1::TrainerMessage m;
  m.mutable_complete()->set_lease_id(lease);
  return m;
}

std::vector<std::string> Leases(const std::vector<v1::TrainerMessage>& ms) {
  std::vector<std::string> out;
  for (const auto& m : ms) out.push_back(m.complete().lease_id());
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
  ledger.Sent("a", Complete("a"), 0);
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
  ledger.Sent("a", Complete("a"), 0);
  ledger.NextSyncId();  // 1
  ledger.Sent("b", Complete("b"), 1);
  ledger.NextSyncId();  // 2
  ledger.Sent("c", Complete("c"), 2);
  // Synced{2} arrives, Synced{1} was lost with a broken stream.
  ledger.Synced(2);
  EXPECT_EQ(Leases(ledger.Unconfirmed()), std::vector<std::string>{"c"});
}

TEST(ReportLedgerTest, ALateSmallerSyncedChangesNothing) {
  ReportLedger ledger;
  ledger.NextSyncId();
  ledger.NextSyncId();
  ledger.Sent("a", Complete("a"), 0);  // after Sync{2}
  ledger.NextSyncId();                 // 3
  ledger.Synced(3);
  ledger.Sent("b", Complete("b"), 1);  // after Sync{3}
  ledger.Synced(1);
  EXPECT_EQ(ledger.synced(), 3u);
  EXPECT_EQ(Leases(ledger.Unconfirmed()), std::vector<std::string>{"b"});
}

TEST(ReportLedgerTest, UnconfirmedReportsComeInGrantOrderNotLeaseIdOrder) {
  ReportLedger ledger;
  ledger.Sent("z", Complete("z"), 0);
  ledger.Sent("m", Complete("m"), 2);
  ledger.Sent("a", Complete("a"), 1);
  EXPECT_EQ(Leases(ledger.Unconfirmed()),
            (std::vector<std::string>{"z", "a", "m"}));
}

TEST(ReportLedgerTest, ASecondReportOfALeaseReplacesTheFirst) {
  ReportLedger ledger;
  ledger.Sent("a", Complete("a"), 0);
  v1::TrainerMessage release;
  release.mutable_release()->set_lease_id("a");
  release.mutable_release()->set_consumed(7);
  ledger.Sent("a", release, 0);
  ASSERT_NE(ledger.Find("a"), nullptr);
  EXPECT_EQ(ledger.Find("a")->release().consumed(), 7);
  EXPECT_EQ(ledger.Unconfirmed().size(), 1u);
}

}  // namespace
}  // namespace sluice::client_internal
