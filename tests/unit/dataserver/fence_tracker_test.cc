#include "server/dataserver/fence_tracker.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sluice::dataserver {
namespace {

using ::sluice::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::Lease MakeLease(const std::string& job, int64_t epoch, int64_t sequence,
                    int64_t begin, int64_t end, uint64_t fence) {
  v1::Lease lease;
  lease.set_lease_id(
      absl::StrCat(job, "/e", epoch, "/u", sequence, "/f", fence));
  lease.set_job(job);
  lease.set_epoch(epoch);
  lease.set_fence(fence);
  lease.mutable_unit()->set_sequence(sequence);
  lease.mutable_unit()->mutable_shard()->set_shard_index(3);
  lease.mutable_unit()->set_begin(begin);
  lease.mutable_unit()->set_end(end);
  return lease;
}

TEST(FenceTrackerTest, TheNewestFenceOfAUnitIsServedAndAnOlderOneAborted) {
  FenceTracker fences;
  EXPECT_EQ(fences.max_fence_seen(), 0u);
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 1, 0, 10, 4)).ok());
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 1, 0, 10, 4)).ok());  // again
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 1, 0, 10, 6)).ok());  // regrant
  EXPECT_THAT(fences.Check(MakeLease("j", 0, 1, 0, 10, 4)),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("lease \"j/e0/u1/f4\" (job \"j\")"),
                             HasSubstr("fence 6 was already presented for "
                                       "samples [0, 10) of shard 3"))));
  EXPECT_EQ(fences.ranges(), 1u);  // fence 6 superseded fence 4
  EXPECT_EQ(fences.max_fence_seen(), 6u);
}

TEST(FenceTrackerTest, PiecesOfASplitUnitShareItsSequenceAndAreBothCurrent) {
  FenceTracker fences;
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 4, 5, 10, 8)).ok());
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 4, 0, 5, 7)).ok());
  EXPECT_EQ(fences.ranges(), 2u);
  // [7, 10) granted again: the fence-8 piece overlaps it, fence 7 does not.
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 4, 7, 10, 9)).ok());
  EXPECT_THAT(fences.Check(MakeLease("j", 0, 4, 5, 10, 8)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("fence 9")));
  EXPECT_TRUE(fences.Check(MakeLease("j", 0, 4, 0, 5, 7)).ok());
  EXPECT_EQ(fences.ranges(), 3u);
}

TEST(FenceTrackerTest, AnEpochTheJobHasLeftIsAbortedAndItsRangesForgotten) {
  FenceTracker fences;
  // Two units, one of them split in two pieces: three ranges.
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 0, 0, 5, 1)).ok());
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 0, 5, 10, 2)).ok());
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 1, 0, 10, 3)).ok());
  EXPECT_EQ(fences.ranges(), 3u);
  ASSERT_TRUE(fences.Check(MakeLease("j", 1, 0, 0, 10, 4)).ok());
  EXPECT_EQ(fences.ranges(), 1u);
  // Epoch 0 is over, even for a unit never presented here.
  EXPECT_THAT(fences.Check(MakeLease("j", 0, 7, 0, 10, 3)),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("but leases of epoch 1 up to fence 4 were "
                                 "already presented: the job has moved on")));
  // A fence above every fence of the job: the job was created again or
  // rolled back by a resume; tracked from there.
  ASSERT_TRUE(fences.Check(MakeLease("j", 0, 0, 0, 10, 5)).ok());
  EXPECT_EQ(fences.ranges(), 1u);
  EXPECT_THAT(fences.Check(MakeLease("j", 1, 0, 0, 10, 4)),
              StatusIs(absl::StatusCode::kAborted));
}

TEST(FenceTrackerTest, JobsAreTrackedApart) {
  FenceTracker fences;
  ASSERT_TRUE(fences.Check(MakeLease("a", 3, 0, 0, 10, 9)).ok());
  // Job b's fences are lower and its epoch differs: not stale.
  ASSERT_TRUE(fences.Check(MakeLease("b", 0, 0, 0, 10, 2)).ok());
  EXPECT_EQ(fences.ranges(), 2u);
  EXPECT_EQ(fences.max_fence_seen(), 9u);
}

TEST(FenceTrackerTest, PastItsBoundItForgetsRangesButKeepsEpochsAndFences) {
  FenceTracker fences(/*max_ranges=*/3);
  for (int unit = 0; unit < 3; ++unit)
    ASSERT_TRUE(fences.Check(MakeLease("j", 2, unit, 0, 10, 1 + unit)).ok());
  EXPECT_EQ(fences.ranges(), 3u);
  ASSERT_TRUE(fences.Check(MakeLease("j", 2, 3, 0, 10, 4)).ok());
  EXPECT_EQ(fences.ranges(), 0u);
  // The per-unit fences are gone: an older fence of unit 0 passes...
  EXPECT_TRUE(fences.Check(MakeLease("j", 2, 0, 0, 10, 1)).ok());
  // ...but the job's epoch and newest fence are kept.
  EXPECT_THAT(fences.Check(MakeLease("j", 1, 0, 0, 10, 2)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("fence 4")));
  EXPECT_EQ(fences.max_fence_seen(), 4u);
}

}  // namespace
}  // namespace sluice::dataserver
