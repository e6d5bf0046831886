#include "client/cpp/cursor.h"

#include <gtest/gtest.h>

#include "sluice/reader.h"

namespace sluice::client_internal {
namespace {

std::vector<int64_t> PerRank(const v1::Cursor& c) {
  return {c.consumed_per_rank().begin(), c.consumed_per_rank().end()};
}
std::vector<int64_t> PerWorker(const v1::Cursor& c) {
  return {c.consumed_per_worker().begin(), c.consumed_per_worker().end()};
}

TEST(PositionCursorTest, ARankKnowsOnlyItsOwnCount) {
  ReaderPosition p;
  p.job = "j";
  p.epoch = 3;
  p.world_size = 3;
  p.rank = 1;
  p.consumed = 40;
  const v1::Cursor c = PositionCursor(p);
  EXPECT_EQ(c.job(), "j");
  EXPECT_EQ(c.epoch(), 3);
  EXPECT_EQ(c.world_size(), 3);
  EXPECT_EQ(PerRank(c), (std::vector<int64_t>{-1, 40, -1}));
  EXPECT_EQ(c.workers_per_rank(), 0);
  EXPECT_EQ(c.consumed_per_worker_size(), 0);
}

TEST(PositionCursorTest, AWorkerKnowsOnlyItsOwnSlot) {
  ReaderPosition p;
  p.job = "j";
  p.world_size = 2;
  p.rank = 1;
  p.worker = 0;
  p.num_workers = 2;
  p.consumed = 9;
  p.source_names = {"web", ""};
  const v1::Cursor c = PositionCursor(p);
  EXPECT_EQ(PerRank(c), (std::vector<int64_t>{-1, -1}));
  EXPECT_EQ(c.workers_per_rank(), 2);
  EXPECT_EQ(PerWorker(c), (std::vector<int64_t>{-1, -1, 9, -1}));
  EXPECT_EQ(c.sources_size(), 2);
  EXPECT_EQ(c.sources(0), "web");
}

TEST(PositionCursorTest, MergedWorkersSumToTheirRank) {
  std::vector<v1::Cursor> cursors;
  int64_t consumed = 5;
  for (int32_t rank = 0; rank < 2; ++rank) {
    for (int32_t worker = 0; worker < 2; ++worker) {
      ReaderPosition p;
      p.job = "j";
      p.world_size = 2;
      p.rank = rank;
      p.worker = worker;
      p.num_workers = 2;
      p.consumed = consumed++;
      cursors.push_back(PositionCursor(p));
    }
  }
  auto merged = MergeCursors(cursors);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(PerWorker(*merged), (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(PerRank(*merged), (std::vector<int64_t>{11, 15}));
  // Without one worker's cursor its rank's count stays unknown.
  cursors.pop_back();
  merged = MergeCursors(cursors);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(PerRank(*merged), (std::vector<int64_t>{11, -1}));
}

}  // namespace
}  // namespace sluice::client_internal
