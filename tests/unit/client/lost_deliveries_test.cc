#include "client/cpp/lost_deliveries.h"

#include <gtest/gtest.h>

namespace sluice::client_internal {
namespace {

v1::Lease Lease(int64_t epoch, int64_t sequence, int32_t shard, int64_t begin,
                int64_t end) {
  v1::Lease lease;
  lease.set_epoch(epoch);
  lease.mutable_unit()->set_sequence(sequence);
  lease.mutable_unit()->mutable_shard()->set_shard_index(shard);
  lease.mutable_unit()->set_begin(begin);
  lease.mutable_unit()->set_end(end);
  return lease;
}

// [10, 20) was granted; 7 samples were delivered, 3 of them reported, when
// the lease expired. The re-grant of [13, 20) starts with 4 delivered ones.
TEST(LostDeliveriesTest, AReGrantSkipsWhatWasDeliveredBeforeTheLoss) {
  LostDeliveries lost;
  lost.Lost(Lease(0, 5, 2, 10, 20), 7);
  EXPECT_EQ(lost.AlreadyDelivered(Lease(0, 5, 2, 13, 20)), 4);
  EXPECT_TRUE(lost.empty());
  EXPECT_EQ(lost.AlreadyDelivered(Lease(0, 5, 2, 13, 20)), 0);
}

TEST(LostDeliveriesTest, OnlyTheSameUnitOfTheSameEpochMatches) {
  LostDeliveries lost;
  lost.Lost(Lease(0, 5, 2, 10, 20), 7);
  EXPECT_EQ(lost.AlreadyDelivered(Lease(1, 5, 2, 13, 20)), 0);  // epoch
  EXPECT_EQ(lost.AlreadyDelivered(Lease(0, 6, 2, 13, 20)), 0);  // unit
  EXPECT_EQ(lost.AlreadyDelivered(Lease(0, 5, 3, 13, 20)), 0);  // shard
  EXPECT_EQ(lost.AlreadyDelivered(Lease(0, 5, 2, 17, 20)), 0);  // past it
  EXPECT_EQ(lost.AlreadyDelivered(Lease(0, 5, 2, 10, 20)), 7);
}

TEST(LostDeliveriesTest, AShorterGrantKeepsTheRestForTheNext) {
  LostDeliveries lost;
  lost.Lost(Lease(0, 5, 2, 10, 20), 8);  // [10, 18)
  EXPECT_EQ(lost.AlreadyDelivered(Lease(0, 5, 2, 12, 15)), 3);
  EXPECT_EQ(lost.AlreadyDelivered(Lease(0, 5, 2, 15, 20)), 3);
  EXPECT_TRUE(lost.empty());
}

TEST(LostDeliveriesTest, NothingDeliveredNothingRememberedAndOldEpochsGo) {
  LostDeliveries lost;
  lost.Lost(Lease(0, 5, 2, 10, 20), 0);
  EXPECT_TRUE(lost.empty());
  lost.Lost(Lease(0, 5, 2, 10, 20), 4);
  lost.Lost(Lease(1, 5, 2, 10, 20), 4);
  lost.ForgetBefore(1);
  EXPECT_EQ(lost.AlreadyDelivered(Lease(0, 5, 2, 10, 20)), 0);
  EXPECT_EQ(lost.AlreadyDelivered(Lease(1, 5, 2, 10, 20)), 4);
}

}  // namespace
}  // namespace sluice::client_internal
