#include "server/coordinator/lease_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using ::sluice::testing::FakeClock;
using ::sluice::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

LeaseEntry MakeLease(const std::string& id, const std::string& holder,
                     uint64_t fence = 1) {
  LeaseEntry lease;
  lease.lease_id = id;
  lease.fence = fence;
  lease.job = "j";
  lease.begin = 10;
  lease.end = 20;
  lease.holder = holder;
  return lease;
}

class LeaseTableTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  LeaseTable table_{&clock_};
};

TEST_F(LeaseTableTest, ExpiresExactlyAtTtl) {
  ASSERT_OK(table_.Add(MakeLease("a", "t1"), absl::Seconds(10)));
  clock_.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  EXPECT_THAT(table_.FindExpired(10), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(table_.FindExpired(10), ElementsAre("a"));
  // Finding does not reclaim.
  EXPECT_THAT(table_.FindExpired(10), ElementsAre("a"));
  EXPECT_EQ(table_.size(), 1u);
  ASSERT_OK(table_.Remove("a"));
  EXPECT_THAT(table_.FindExpired(10), IsEmpty());
}

TEST_F(LeaseTableTest, TtlHasAMinimum) {
  ASSERT_OK(table_.Add(MakeLease("a", "t1"), absl::Milliseconds(1)));
  clock_.Advance(absl::Milliseconds(499));
  EXPECT_THAT(table_.FindExpired(10), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(table_.FindExpired(10), ElementsAre("a"));
}

TEST_F(LeaseTableTest, RenewalByHolderExtendsOnlyThatHoldersLeases) {
  ASSERT_OK(table_.Add(MakeLease("a", "t1"), absl::Seconds(10)));
  ASSERT_OK(table_.Add(MakeLease("b", "t1"), absl::Seconds(10)));
  ASSERT_OK(table_.Add(MakeLease("c", "t2"), absl::Seconds(10)));
  clock_.Advance(absl::Seconds(8));
  EXPECT_EQ(table_.RenewHolder("t1", absl::Seconds(10)), 2);
  EXPECT_EQ(table_.RenewHolder("nobody", absl::Seconds(10)), 0);
  clock_.Advance(absl::Seconds(2));
  EXPECT_THAT(table_.FindExpired(10), ElementsAre("c"));
  ASSERT_OK(table_.Remove("c"));
  EXPECT_EQ(table_.NextExpiry(), absl::FromUnixSeconds(1'700'000'018));
  clock_.Advance(absl::Seconds(8));
  EXPECT_THAT(table_.FindExpired(10), UnorderedElementsAre("a", "b"));
  EXPECT_EQ(table_.FindExpired(1).size(), 1u);
}

TEST_F(LeaseTableTest, StaleFenceIsAbortedUnknownIsNotFound) {
  ASSERT_OK(table_.Add(MakeLease("a", "t1", 3), absl::Seconds(10)));
  EXPECT_OK(table_.Check("a", 3));
  EXPECT_THAT(table_.Check("a", 2), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(table_.SetProgress("a", 2, 1),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(table_.Check("zz", 1), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(table_.Add(MakeLease("a", "t9"), absl::Seconds(1)),
              StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST_F(LeaseTableTest, RemainderComesFromTheLastProgress) {
  ASSERT_OK(table_.Add(MakeLease("a", "t1"), absl::Seconds(10)));
  ASSERT_OK(table_.SetProgress("a", 1, 4));
  ASSERT_OK(table_.SetProgress("a", 1, 6));
  EXPECT_THAT(table_.SetProgress("a", 1, 5),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(table_.SetProgress("a", 1, 11),
              StatusIs(absl::StatusCode::kInvalidArgument));
  clock_.Advance(absl::Seconds(10));
  ASSERT_THAT(table_.FindExpired(10), ElementsAre("a"));
  absl::StatusOr<LeaseEntry> reclaimed = table_.Remove("a");
  ASSERT_OK(reclaimed);
  EXPECT_EQ(reclaimed->consumed, 6);
  EXPECT_EQ(reclaimed->remaining(), 4);  // [16, 20) goes back to the queue
  EXPECT_THAT(table_.HeldBy("t1"), IsEmpty());
}

TEST_F(LeaseTableTest, RefreshAllGivesEveryLeaseAFreshTtl) {
  ASSERT_OK(table_.Add(MakeLease("a", "t1"), absl::Seconds(10)));
  ASSERT_OK(table_.Add(MakeLease("b", "t2"), absl::Seconds(3)));
  clock_.Advance(absl::Seconds(9));
  table_.RefreshAll(absl::Seconds(10));
  clock_.Advance(absl::Seconds(9));
  EXPECT_THAT(table_.FindExpired(10), IsEmpty());
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(table_.FindExpired(10), UnorderedElementsAre("a", "b"));
}

TEST_F(LeaseTableTest, RepeatedRenewalsKeepTheLeaseAlive) {
  ASSERT_OK(table_.Add(MakeLease("a", "t1"), absl::Seconds(10)));
  for (int i = 0; i < 1000; ++i) {
    clock_.Advance(absl::Seconds(1));
    table_.RenewHolder("t1", absl::Seconds(10));
    EXPECT_THAT(table_.FindExpired(10), IsEmpty());
  }
  EXPECT_EQ(table_.NextExpiry(), clock_.Now() + absl::Seconds(10));
}

// A renewal moves the lease's expiry without pushing a heap entry: one entry
// per lease however often its holder heartbeats, and the lease still expires
// exactly one TTL after its last renewal.
TEST_F(LeaseTableTest, RenewalIsInPlace) {
  ASSERT_OK(table_.Add(MakeLease("a", "t1"), absl::Seconds(10)));
  for (int beat = 0; beat < 95; ++beat) {
    clock_.Advance(absl::Milliseconds(1300));
    ASSERT_EQ(table_.RenewHolder("t1", absl::Seconds(10)), 1);
    ASSERT_THAT(table_.FindExpired(10), IsEmpty());
    ASSERT_EQ(table_.heap_entries(), 1u) << beat;
  }
  clock_.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  EXPECT_THAT(table_.FindExpired(10), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(table_.FindExpired(10), ElementsAre("a"));
  EXPECT_EQ(table_.heap_entries(), 1u);
}

TEST_F(LeaseTableTest, RenewingManyLeasesKeepsTheHeapBoundedAndExpiryExact) {
  // One holder with 2,000 leases heartbeats 500 times while another
  // holder's single lease, older, sits at the top of the heap unrenewed.
  ASSERT_OK(table_.Add(MakeLease("quiet", "t2"), absl::Seconds(10)));
  for (int i = 0; i < 2000; ++i) {
    ASSERT_OK(table_.Add(MakeLease(absl::StrCat("busy", i), "t1"),
                         absl::Seconds(10)));
  }
  for (int beat = 0; beat < 500; ++beat) {
    clock_.Advance(absl::Milliseconds(10));
    ASSERT_EQ(table_.RenewHolder("t1", absl::Seconds(10)), 2000);
    ASSERT_LE(table_.heap_entries(), 2 * table_.size() + 64);
  }
  // 5 s have passed: the quiet lease expires at 10 s, the busy ones at 15 s.
  clock_.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  EXPECT_THAT(table_.FindExpired(10), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(table_.FindExpired(10), ElementsAre("quiet"));
  ASSERT_OK(table_.Remove("quiet").status());
  clock_.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  EXPECT_THAT(table_.FindExpired(10), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(table_.FindExpired(5000).size(), 2000u);
}

TEST(LeaseTableShardsTest, ASharedShardIsReadByAnotherJobWhileItsLeaseLives) {
  testing::FakeClock clock;
  LeaseTable table(&clock);
  LeaseEntry a = MakeLease("a/e0/f1", "a/t0");
  a.job = "a";
  a.shard_url = "/d/3.tar";  // samples [10, 20)
  ASSERT_TRUE(table.Add(a, absl::Seconds(10)).ok());
  LeaseEntry window = MakeLease("a/e0/f2", "a/t0", 2);
  window.job = "a";  // a window unit: no shard of its own
  ASSERT_TRUE(table.Add(window, absl::Seconds(10)).ok());
  EXPECT_EQ(table.OtherJobs("a"), 0u);
  EXPECT_EQ(table.OtherJobs("b"), 1u);
  EXPECT_TRUE(table.ReadByOtherJob("/d/3.tar", "b", 0, 11));
  EXPECT_TRUE(table.ReadByOtherJob("/d/3.tar", "b", 19, 30));
  EXPECT_FALSE(table.ReadByOtherJob("/d/3.tar", "b", 20, 30));  // no overlap
  EXPECT_FALSE(table.ReadByOtherJob("/d/3.tar", "b", 0, 10));
  EXPECT_FALSE(table.ReadByOtherJob("/d/3.tar", "a", 10, 20));  // its own
  EXPECT_FALSE(table.ReadByOtherJob("/d/4.tar", "b", 10, 20));
  ASSERT_TRUE(table.Remove("a/e0/f1").ok());
  EXPECT_FALSE(table.ReadByOtherJob("/d/3.tar", "b", 10, 20));
  EXPECT_EQ(table.OtherJobs("b"), 1u);  // the window lease
  ASSERT_TRUE(table.Remove("a/e0/f2").ok());
  EXPECT_EQ(table.OtherJobs("b"), 0u);
}

}  // namespace
}  // namespace sluice
