#include "server/coordinator/work_queues.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

Piece MakePiece(int32_t shard, int64_t begin, int64_t end, int32_t slot = 0,
                int32_t returned_to = -1) {
  Piece p;
  p.sequence = shard;
  p.shard_index = shard;
  p.begin = begin;
  p.end = end;
  p.slot = slot;
  p.returned_to = returned_to;
  return p;
}

// A job of `slots` readers (one rank each) over `shards` shards of 10
// samples; static (one queue per slot) or dynamic (one shared queue).
JobData MakeJob(const std::string& name, bool per_slot, int32_t slots,
                int32_t shards = 4) {
  JobData job;
  job.spec.set_name(name);
  job.spec.set_mode(per_slot ? v1::MODE_STATIC : v1::MODE_DYNAMIC);
  job.spec.set_world_size(slots);
  auto samples = std::make_shared<std::vector<int64_t>>(shards, 10);
  job.shard_samples = samples;
  job.plan.num_ranks = slots;
  job.plan.samples_per_rank = 10 * shards / slots;
  return job;
}

// "shard:begin-end" of each piece, front first.
std::vector<std::string> Describe(const std::deque<Piece>& queue) {
  std::vector<std::string> out;
  for (const Piece& p : queue) {
    out.push_back(std::to_string(p.shard_index) + ":" +
                  std::to_string(p.begin) + "-" + std::to_string(p.end));
  }
  return out;
}

bool AllOffered(uint64_t) { return true; }
bool NoneOffered(uint64_t) { return false; }
bool NoneKept(int32_t) { return false; }

TEST(WorkQueuesTest, RebuildPutsEachPendingPieceInItsSlotsQueue) {
  WorkQueues queues;
  const JobData job = MakeJob("j", /*per_slot=*/true, /*slots=*/2);
  queues.Rebuild(
      job,
      [] {
        return std::vector<Piece>{MakePiece(0, 0, 10, 0),
                                  MakePiece(1, 0, 10, 1),
                                  MakePiece(2, 0, 10, 0)};
      },
      AllOffered);
  EXPECT_THAT(Describe(queues.Upcoming(job, 0)),
              ElementsAre("0:0-10", "2:0-10"));
  EXPECT_THAT(Describe(queues.Upcoming(job, 1)), ElementsAre("1:0-10"));

  // A shared queue: every slot reads the same one.
  const JobData shared = MakeJob("k", /*per_slot=*/false, /*slots=*/2);
  queues.Rebuild(
      shared,
      [] {
        return std::vector<Piece>{MakePiece(0, 0, 10, 0),
                                  MakePiece(1, 0, 10, 1)};
      },
      AllOffered);
  EXPECT_THAT(Describe(queues.Upcoming(shared, 1)),
              ElementsAre("0:0-10", "1:0-10"));
}

TEST(WorkQueuesTest, TakeSplitsAPieceAtTheLimitAndLeavesTheRestInFront) {
  WorkQueues queues;
  const JobData job = MakeJob("j", false, 1);
  queues.Rebuild(
      job,
      [] {
        return std::vector<Piece>{MakePiece(0, 0, 10), MakePiece(1, 0, 10)};
      },
      AllOffered);
  WorkQueues::Shortage why = WorkQueues::Shortage::kEmpty;
  std::optional<Piece> taken = queues.Take(job, 0, 4, NoneKept, &why);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(why, WorkQueues::Shortage::kNone);
  EXPECT_EQ(taken->shard_index, 0);
  EXPECT_EQ(taken->begin, 0);
  EXPECT_EQ(taken->end, 4);
  EXPECT_THAT(Describe(queues.Upcoming(job, 0)),
              ElementsAre("0:4-10", "1:0-10"));
  // A limit above the piece takes it whole.
  taken = queues.Take(job, 0, 100, NoneKept, &why);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->begin, 4);
  EXPECT_EQ(taken->end, 10);
  EXPECT_THAT(Describe(queues.Upcoming(job, 0)), ElementsAre("1:0-10"));
  ASSERT_TRUE(queues.Take(job, 0, 100, NoneKept, &why).has_value());
  EXPECT_FALSE(queues.Take(job, 0, 100, NoneKept, &why).has_value());
  EXPECT_EQ(why, WorkQueues::Shortage::kEmpty);
}

TEST(WorkQueuesTest, RemaindersKeptForAnotherSlotArePassedOver) {
  WorkQueues queues;
  const JobData job = MakeJob("j", false, 2);
  queues.Rebuild(
      job, [] { return std::vector<Piece>{MakePiece(1, 0, 10)}; }, AllOffered);
  // An expired lease of slot 1 returns its remainder to the front.
  queues.Return(job, 1, MakePiece(0, 3, 10, 1, /*returned_to=*/1));
  EXPECT_THAT(Describe(queues.Upcoming(job, 0)),
              ElementsAre("0:3-10", "1:0-10"));
  const auto slot1_keeps = [](int32_t slot) { return slot == 1; };
  WorkQueues::Shortage why = WorkQueues::Shortage::kNone;
  // Slot 0 passes over it while slot 1 keeps it...
  std::optional<Piece> taken = queues.Take(job, 0, 100, slot1_keeps, &why);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->shard_index, 1);
  EXPECT_FALSE(queues.Take(job, 0, 100, slot1_keeps, &why).has_value());
  EXPECT_EQ(why, WorkQueues::Shortage::kOthersRemainders);
  // ...slot 1 itself takes it...
  queues.Return(job, 1, MakePiece(0, 3, 10, 1, 1));
  taken = queues.Take(job, 1, 100, slot1_keeps, &why);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->begin, 3);
  // ...and anyone may once slot 1 no longer keeps it.
  queues.Return(job, 1, MakePiece(0, 5, 10, 1, 1));
  taken = queues.Take(job, 0, 100, NoneKept, &why);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->begin, 5);
}

TEST(WorkQueuesTest, RebuildInstallsTheFreshQueuesOfTheOfferedPlan) {
  WorkQueues queues;
  JobData job = MakeJob("j", false, 1);
  std::vector<std::deque<Piece>> fresh(1);
  fresh[0].push_back(MakePiece(3, 0, 10));
  queues.Offer("j", 7, fresh, AllOffered);
  int pending_calls = 0;
  const auto pending = [&] {
    ++pending_calls;
    return std::vector<Piece>{MakePiece(0, 0, 10)};
  };
  // Installed from plan 7, nothing granted yet: its fresh queues, without
  // listing the state's pending pieces.
  job.plan_serial = 7;
  queues.Rebuild(job, pending, AllOffered);
  EXPECT_EQ(pending_calls, 0);
  EXPECT_THAT(Describe(queues.Upcoming(job, 0)), ElementsAre("3:0-10"));
  // Taken once: a second rebuild (something granted since) lists them.
  job.leases["j/e0/f1"] = DurableLease{};
  queues.Rebuild(job, pending, AllOffered);
  EXPECT_EQ(pending_calls, 1);
  EXPECT_THAT(Describe(queues.Upcoming(job, 0)), ElementsAre("0:0-10"));
}

TEST(WorkQueuesTest, FreshQueuesOfPlansNoLongerOfferedAreDropped) {
  WorkQueues queues;
  JobData job = MakeJob("j", false, 1);
  std::vector<std::deque<Piece>> fresh(1);
  fresh[0].push_back(MakePiece(3, 0, 10));
  queues.Offer("j", 7, fresh, AllOffered);
  // Plan 8's offer is refused, and the state has let go of plan 7.
  queues.Offer("j", 8, fresh, NoneOffered);
  job.plan_serial = 7;
  queues.Rebuild(
      job, [] { return std::vector<Piece>{MakePiece(0, 0, 10)}; }, AllOffered);
  EXPECT_THAT(Describe(queues.Upcoming(job, 0)), ElementsAre("0:0-10"));
  // A deleted job's queues go with it.
  queues.Erase("j");
  EXPECT_THAT(queues.Upcoming(job, 0), IsEmpty());
}

TEST(WorkQueuesTest, WindowsAreThoseOfTheJobsCurrentEpoch) {
  WorkQueues queues;
  JobData job = MakeJob("j", false, 1, /*shards=*/8);
  job.options.shuffle = true;
  job.options.shuffle_window = 2;
  job.options.seed = 5;
  const std::vector<ShuffleWindow> first = queues.Windows(job);
  EXPECT_EQ(first.size(), 4u);
  const auto expected = [&](int64_t epoch) {
    return PlanWindows(*job.shard_samples, job.options, epoch);
  };
  ASSERT_EQ(first.size(), expected(0).size());
  for (size_t w = 0; w < first.size(); ++w) {
    EXPECT_EQ(first[w].shards, expected(0)[w].shards);
    EXPECT_EQ(first[w].order_seed, expected(0)[w].order_seed);
  }
  job.epoch = 1;
  const std::vector<ShuffleWindow>& next = queues.Windows(job);
  ASSERT_EQ(next.size(), expected(1).size());
  for (size_t w = 0; w < next.size(); ++w) {
    EXPECT_EQ(next[w].order_seed, expected(1)[w].order_seed);
  }
  // A job without windows has none.
  EXPECT_THAT(queues.Windows(MakeJob("k", false, 1)), IsEmpty());
}

}  // namespace
}  // namespace sluice
