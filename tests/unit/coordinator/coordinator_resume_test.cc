// CoordinatorService: Resuming from a cursor (G7): the same and another world
// size, twice, across restarts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "server/common/lease_token.h"
#include "server/coordinator/coordinator_metrics.h"
#include "server/coordinator/coordinator_service.h"
#include "tests/testing/coordinator_fixture.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/gated_journal.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::CoordinatorServiceTest;
using ::sluice::testing::CreateJournaled;
using ::sluice::testing::FakeClock;
using ::sluice::testing::JournaledOptions;
using ::sluice::testing::MakeCursor;
using ::sluice::testing::SimTrainer;
using ::sluice::testing::Spec;
using ::sluice::testing::StatusIs;
using ::sluice::testing::Tally;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Job "j" (35 samples over 2 ranks, q = 17, units of 4): rank 0 reads 6
// samples and rank 1 9, then the checkpoint is taken (`cursor`, and what
// the model had seen: `before`).
struct Checkpointed {
  explicit Checkpointed(CoordinatorService& service) {
    v1::JobSpec spec = Spec("j", {7, 0, 1, 13, 5, 9}, 2, 2);
    spec.set_max_samples_per_lease(4);
    if (!service.CreateJob(spec).ok()) return;
    a = std::make_unique<SimTrainer>(service, "j", 0, "a");
    b = std::make_unique<SimTrainer>(service, "j", 1, "b");
    ok = a->Consume(6) == 6 && b->Consume(9) == 9;
    cursor = MakeCursor("j", 0, 2, {6, 9});
    before.insert(before.end(), a->consumed.begin(), a->consumed.end());
    before.insert(before.end(), b->consumed.begin(), b->consumed.end());
  }
  bool ok = false;
  std::unique_ptr<SimTrainer> a, b;
  v1::Cursor cursor;
  std::vector<std::tuple<int64_t, int32_t, int64_t>> before;
};

// A trainer restarts from a checkpoint taken earlier in the epoch: every
// rank continues right after the last sample it had consumed at the
// checkpoint, the samples consumed after it are served again, and the
// epoch still covers every sample exactly once (G7).
TEST_F(CoordinatorServiceTest,
       ResumeWithTheSameWorldSizeContinuesAfterTheCursor) {
  Checkpointed run(*service_);
  ASSERT_TRUE(run.ok);
  SimTrainer &a = *run.a, &b = *run.b;
  const v1::Cursor& cursor = run.cursor;
  const auto& before = run.before;
  ASSERT_EQ(a.Consume(5), 5);  // seen by the model, then lost in the crash
  ASSERT_EQ(b.Consume(3), 3);

  SimTrainer a2(*service_, "j", 0, "a2", &cursor, "restart-1");
  EXPECT_GT(a.sink->Count(v1::CoordinatorMessage::kRevoke), 0);
  ASSERT_EQ(a2.Consume(2), 2);
  // Rank 1 of the same restart repeats the cursor: a no-op, rank 0 keeps
  // the two samples it consumed since.
  SimTrainer b2(*service_, "j", 1, "b2", &cursor, "restart-1");
  ASSERT_TRUE(a2.sink->finished == std::nullopt);
  ASSERT_TRUE(b2.sink->finished == std::nullopt);
  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().ranks(0).consumed(), 8);
  EXPECT_EQ(job->status().ranks(1).consumed(), 9);

  while (a2.Consume(1000) + b2.Consume(1000) > 0) {
  }
  ASSERT_FALSE(a2.begins.empty());
  EXPECT_EQ(a2.begins[0].epoch(), 0);
  EXPECT_EQ(a2.begins[0].samples_for_rank(), 17);
  EXPECT_EQ(a2.begins[0].already_consumed(), 6);
  ASSERT_FALSE(b2.begins.empty());
  EXPECT_EQ(b2.begins[0].already_consumed(), 9);
  std::vector<std::tuple<int64_t, int32_t, int64_t>> epoch0, epoch1;
  for (const auto* t : {&a2, &b2}) {
    for (const auto& s : t->consumed)
      (std::get<0>(s) == 0 ? epoch0 : epoch1).push_back(s);
  }
  EXPECT_EQ(epoch0.size() + before.size(), 34u);
  auto seen = Tally({before, epoch0});
  EXPECT_EQ(seen.size(), 34u);  // 35 - 1 dropped, none twice
  for (const auto& [s, n] : seen) EXPECT_EQ(n, 1);
  EXPECT_EQ(epoch1.size(), 34u);
  a2.Poll();
  EXPECT_TRUE(a2.job_done);
}

// A run resumes from a checkpoint, consumes, and dies before its next
// checkpoint; the next run resumes from the same checkpoint with the same
// attempt (none given: no launcher names restarts). Each restore is told
// apart by its launch id: the second one restores the checkpoint's position
// again, and its other rank joins it; the epoch stays exactly once.
TEST_F(CoordinatorServiceTest, ResumingTwiceFromOneCheckpointRestoresItTwice) {
  Checkpointed run(*service_);
  ASSERT_TRUE(run.ok);
  SimTrainer& a = *run.a;
  const v1::Cursor& cursor = run.cursor;
  const auto& before = run.before;
  ASSERT_EQ(a.Consume(2), 2);  // lost with the first crash

  // Restart 1: both ranks restore the checkpoint, consume, and die.
  SimTrainer a2(*service_, "j", 0, "a2", &cursor, "", 0, 0, "launch-1a");
  SimTrainer b2(*service_, "j", 1, "b2", &cursor, "", 0, 0, "launch-1b");
  ASSERT_TRUE(a2.sink->finished == std::nullopt);
  ASSERT_EQ(a2.Consume(5), 5);
  ASSERT_EQ(b2.Consume(4), 4);
  EXPECT_EQ(service_->GetJob("j", false)->status().ranks(0).consumed(), 11);

  // Restart 2 restores the same checkpoint: rank 1 first this time.
  SimTrainer b3(*service_, "j", 1, "b3", &cursor, "", 0, 0, "launch-2b");
  EXPECT_THAT(a2.sink->finished, ::testing::Optional(StatusIs(
                                     absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("resumed"))));
  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().ranks(0).consumed(), 6);
  EXPECT_EQ(job->status().ranks(1).consumed(), 9);
  ASSERT_EQ(b3.Consume(2), 2);
  SimTrainer a3(*service_, "j", 0, "a3", &cursor, "", 0, 0, "launch-2a");
  ASSERT_TRUE(b3.sink->finished == std::nullopt);  // a3 joined: no reset
  EXPECT_EQ(service_->GetJob("j", false)->status().ranks(1).consumed(), 11);
  // The same launch for the same slot again (a DataLoader worker started
  // anew for the next epoch re-sends the cursor): nothing moves.
  ASSERT_EQ(a3.Consume(3), 3);
  SimTrainer a3again(*service_, "j", 0, "a3", &cursor, "", 0, 0, "launch-2a");
  EXPECT_EQ(service_->GetJob("j", false)->status().ranks(0).consumed(), 9);

  std::vector<std::tuple<int64_t, int32_t, int64_t>> epoch0;
  while (a3again.Consume(1000) + b3.Consume(1000) > 0) {
  }
  for (const auto* t : {&a3, &a3again, &b3}) {
    for (const auto& s : t->consumed)
      if (std::get<0>(s) == 0) epoch0.push_back(s);
  }
  auto seen = Tally({before, epoch0});
  EXPECT_EQ(seen.size(), 34u);  // 35 - 1 dropped
  for (const auto& [s, n] : seen) EXPECT_EQ(n, 1) << std::get<2>(s);
}

// Which launch joined which slot of the last resume is journaled: after a
// coordinator restart, the next restore of the same checkpoint still
// restores it, and a launch that already joined is still a no-op.
TEST(CoordinatorResumeTest, LaunchesOfTheLastResumeSurviveARestart) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock);
  const v1::Cursor cursor = MakeCursor("j", 0, 2, {4, 3});
  {
    auto created = CreateJournaled(options, dir.path());
    ASSERT_OK(created);
    v1::JobSpec spec = Spec("j", {10, 10}, 2, 2);  // q = 10
    spec.set_max_samples_per_lease(3);
    ASSERT_OK((*created)->CreateJob(spec));
    SimTrainer a(**created, "j", 0, "a"), b(**created, "j", 1, "b");
    ASSERT_EQ(a.Consume(4), 4);
    ASSERT_EQ(b.Consume(3), 3);
    SimTrainer a2(**created, "j", 0, "a2", &cursor, "", 0, 0, "one-a");
    SimTrainer b2(**created, "j", 1, "b2", &cursor, "", 0, 0, "one-b");
    ASSERT_EQ(a2.Consume(5), 5);
    ASSERT_EQ(b2.Consume(5), 5);
  }
  auto reopened = CreateJournaled(options, dir.path());
  ASSERT_OK(reopened);
  EXPECT_EQ((*reopened)->GetJob("j", false)->status().ranks(0).consumed(), 9);
  SimTrainer same(**reopened, "j", 1, "b2", &cursor, "", 0, 0, "one-b");
  EXPECT_EQ((*reopened)->GetJob("j", false)->status().ranks(1).consumed(), 8);
  SimTrainer next(**reopened, "j", 1, "b3", &cursor, "", 0, 0, "two-b");
  auto job = (*reopened)->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().ranks(0).consumed(), 4);
  EXPECT_EQ(job->status().ranks(1).consumed(), 3);
}

// A cursor from the previous epoch moves the job back into it.
TEST_F(CoordinatorServiceTest, ResumeIntoThePreviousEpoch) {
  ASSERT_OK(service_->CreateJob(Spec("j", {10, 10}, 2, 3)));  // q = 10
  SimTrainer a(*service_, "j", 0, "a"), b(*service_, "j", 1, "b");
  ASSERT_EQ(a.Consume(10), 10);
  ASSERT_EQ(b.Consume(10), 10);
  ASSERT_EQ(a.Consume(3), 3);  // epoch 1
  const v1::Cursor cursor = MakeCursor("j", 0, 2, {4, 7});
  SimTrainer a2(*service_, "j", 0, "a2", &cursor),
      b2(*service_, "j", 1, "b2", &cursor);
  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().epoch(), 0);
  EXPECT_EQ(job->status().consumed_in_epoch(), 11);
  EXPECT_EQ(a2.Consume(6), 6);
  EXPECT_EQ(b2.Consume(3), 3);
  // The first 4 and 7 samples each rank consumed, then the rest once.
  std::vector<std::tuple<int64_t, int32_t, int64_t>> kept(
      a.consumed.begin(), a.consumed.begin() + 4);
  kept.insert(kept.end(), b.consumed.begin(), b.consumed.begin() + 7);
  auto seen = Tally({kept, a2.consumed, b2.consumed});
  EXPECT_EQ(seen.size(), 20u);
  for (const auto& [s, n] : seen) {
    EXPECT_EQ(n, 1);
    EXPECT_EQ(std::get<0>(s), 0);
  }
  EXPECT_EQ(a2.Consume(1), 1);
  EXPECT_EQ(std::get<0>(a2.consumed.back()), 1);  // epoch 0 done, on to 1
}

// World size 4 -> 3 (a node lost): the new job resumes from the old job's
// cursor and re-balances the epoch's unconsumed samples over 3 ranks; every
// sample is still served at most once, and the next epoch is planned for 3.
// The resume survives a coordinator restart (the journal replays it).
TEST(CoordinatorResumeTest, AnotherWorldSizeRebalancesTheRestOfTheEpoch) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock);
  v1::Job before;
  {
    auto created = CreateJournaled(options, dir.path());
    ASSERT_OK(created);
    CoordinatorService& service = **created;
    v1::JobSpec four =
        Spec("four", {11, 3, 17, 8, 0, 12}, 4, 2);  // T = 51, q = 12
    four.set_max_samples_per_lease(5);
    ASSERT_OK(service.CreateJob(four));
    std::vector<std::unique_ptr<SimTrainer>> old;
    std::vector<std::tuple<int64_t, int32_t, int64_t>> kept;
    const std::vector<int64_t> counts = {3, 12, 0, 7};
    for (int r = 0; r < 4; ++r) {
      old.push_back(std::make_unique<SimTrainer>(service, "four", r,
                                                 "old" + std::to_string(r)));
      ASSERT_EQ(old[r]->Consume(counts[r]), counts[r]);
      kept.insert(kept.end(), old[r]->consumed.begin(), old[r]->consumed.end());
      old[r]->Consume(2);  // after the checkpoint: served again below
    }
    v1::JobSpec three = four;
    three.set_name("three");
    three.set_world_size(3);
    ASSERT_OK(service.CreateJob(three));
    const v1::Cursor cursor = MakeCursor("four", 0, 4, counts);
    std::vector<std::unique_ptr<SimTrainer>> fresh;
    for (int r = 0; r < 3; ++r) {
      fresh.push_back(std::make_unique<SimTrainer>(
          service, "three", r, "new" + std::to_string(r), &cursor));
    }
    // 48 served by "four" in epoch 0, 22 consumed: 26 left -> 8 per rank.
    for (auto& t : fresh) {
      ASSERT_FALSE(t->begins.empty());
      EXPECT_EQ(t->begins[0].epoch(), 0);
      EXPECT_EQ(t->begins[0].samples_for_rank(), 8);
      EXPECT_EQ(t->begins[0].already_consumed(), 0);
      EXPECT_EQ(t->Consume(8), 8);
    }
    std::vector<std::tuple<int64_t, int32_t, int64_t>> after;
    for (auto& t : fresh)
      after.insert(after.end(), t->consumed.begin(), t->consumed.end());
    auto seen = Tally({kept, after});
    EXPECT_EQ(seen.size(), 22u + 24u);
    for (const auto& [s, n] : seen) EXPECT_EQ(n, 1);
    // Epoch 1 of "three" is a normal world-size-3 epoch: 17 per rank.
    EXPECT_EQ(fresh[0]->Consume(1), 1);
    ASSERT_EQ(fresh[0]->begins.size(), 2u);
    EXPECT_EQ(fresh[0]->begins[1].epoch(), 1);
    EXPECT_EQ(fresh[0]->begins[1].samples_for_rank(), 17);
    before = *service.GetJob("three", false);
  }
  auto service = CreateJournaled(options, dir.path());
  ASSERT_OK(service);
  v1::Job after = *(*service)->GetJob("three", false);
  for (int r = 0; r < 3; ++r)
    before.mutable_status()->mutable_ranks(r)->clear_sessions();
  before.mutable_status()->clear_leases();  // counted since start-up
  after.mutable_status()->clear_leases();
  EXPECT_EQ(after.status().DebugString(), before.status().DebugString());
}

// Deleting a job deletes its copies for other world sizes with it (the
// "<job>.w<N>" jobs elastic runs make), ending their sessions, and nothing
// else: jobs whose names only look alike stay. A restart over the journal
// agrees.
TEST(CoordinatorResumeTest, DeletingAJobDeletesItsCopiesAndOnlyThem) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock);
  auto created = CreateJournaled(options, dir.path());
  ASSERT_OK(created);
  CoordinatorService& service = **created;
  ASSERT_OK(service.CreateJob(Spec("four", {11, 3}, 4, 1)));
  const std::vector<std::string> others = {"four.wide", "four.w03",
                                           "fourth.w3"};
  for (const std::string& name : others)
    ASSERT_OK(service.CreateJob(Spec(name, {5}, 1, 1)));
  ASSERT_OK(service.CopyJob("four", "four.w3", 3));
  ASSERT_OK(service.CopyJob("four", "four.w2", 2));
  SimTrainer on_copy(service, "four.w3", 0, "c0");
  ASSERT_FALSE(on_copy.held.empty());

  auto deleted_names = service.DeleteJob("four");
  ASSERT_OK(deleted_names);
  EXPECT_THAT(*deleted_names, ElementsAre("four.w2", "four.w3", "four"));
  service.Flush();
  ASSERT_TRUE(on_copy.sink->finished.has_value());
  EXPECT_THAT(*on_copy.sink->finished,
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("job four.w3 was deleted")));
  auto deleted = [](CoordinatorService& s) {
    for (const char* name : {"four", "four.w3", "four.w2"}) {
      EXPECT_THAT(s.GetJob(name, false),
                  StatusIs(absl::StatusCode::kNotFound, HasSubstr(name)));
    }
  };
  deleted(service);
  for (const std::string& name : others) EXPECT_OK(service.GetJob(name, false));

  created->reset();
  auto restarted = CreateJournaled(options, dir.path());
  ASSERT_OK(restarted);
  deleted(**restarted);
  for (const std::string& name : others)
    EXPECT_OK((*restarted)->GetJob(name, false));
}

// An elastic run: 4 ranks, then 3 (a node left: the job's copy for 3 ranks
// resumes from the 4-rank checkpoint), then 4 again (the job itself resumes
// from the copy's checkpoint). Every sample of the epoch is trained at most
// once, and only each re-plan's remainder (under world size) is left out.
TEST(CoordinatorResumeTest, AJobAndItsCopyResumeEachOtherBothWays) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock);
  auto created = CreateJournaled(options, dir.path());
  ASSERT_OK(created);
  CoordinatorService& service = **created;
  v1::JobSpec four = Spec("four", {11, 3, 17, 8, 0, 12}, 4, 2);  // q = 12
  four.set_max_samples_per_lease(5);
  ASSERT_OK(service.CreateJob(four));
  std::vector<std::unique_ptr<SimTrainer>> old;
  const std::vector<int64_t> at_four = {3, 12, 0, 7};
  std::vector<std::vector<std::tuple<int64_t, int32_t, int64_t>>> trained;
  for (int r = 0; r < 4; ++r) {
    old.push_back(std::make_unique<SimTrainer>(service, "four", r,
                                               "a" + std::to_string(r)));
    ASSERT_EQ(old[r]->Consume(at_four[r]), at_four[r]);
    trained.push_back(old[r]->consumed);
  }

  absl::StatusOr<v1::Job> copy = service.CopyJob("four", "four.w3", 3);
  ASSERT_OK(copy);
  v1::JobSpec expected = *service.GetJob("four", true).value().mutable_spec();
  expected.set_name("four.w3");
  expected.set_world_size(3);
  EXPECT_EQ(service.GetJob("four.w3", true)->spec().DebugString(),
            expected.DebugString());
  EXPECT_OK(service.CopyJob("four", "four.w3", 3));  // idempotent
  EXPECT_THAT(service.CopyJob("four", "four.w3", 2),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("four.w3")));
  EXPECT_THAT(service.CopyJob("five", "five.w3", 3),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("five")));

  const v1::Cursor from_four = MakeCursor("four", 0, 4, at_four);
  std::vector<std::unique_ptr<SimTrainer>> three;
  const std::vector<int64_t> at_three = {5, 2, 8};
  for (int r = 0; r < 3; ++r) {
    three.push_back(std::make_unique<SimTrainer>(service, "four.w3", r,
                                                 "b" + std::to_string(r),
                                                 &from_four, "", 0, 0, "b"));
    // 48 planned, 22 trained: 26 left -> 8 per rank (2 left out).
    ASSERT_FALSE(three[r]->begins.empty());
    EXPECT_EQ(three[r]->begins[0].samples_for_rank(), 8);
    ASSERT_EQ(three[r]->Consume(at_three[r]), at_three[r]);
    trained.push_back(three[r]->consumed);
  }

  const v1::Cursor from_three = MakeCursor("four.w3", 0, 3, at_three);
  std::vector<std::unique_ptr<SimTrainer>> again;
  for (int r = 0; r < 4; ++r) {
    again.push_back(std::make_unique<SimTrainer>(service, "four", r,
                                                 "c" + std::to_string(r),
                                                 &from_three, "", 0, 0, "c"));
    // 24 planned, 15 trained: 9 left -> 2 per rank (1 left out).
    ASSERT_FALSE(again[r]->begins.empty());
    EXPECT_EQ(again[r]->begins[0].epoch(), 0);
    EXPECT_EQ(again[r]->begins[0].samples_for_rank(), 2);
    ASSERT_EQ(again[r]->Consume(2), 2);
    trained.push_back(again[r]->consumed);
  }
  auto seen = Tally(trained);
  EXPECT_EQ(seen.size(), 22u + 15u + 8u);
  for (const auto& [sample, n] : seen) EXPECT_EQ(n, 1);
  // Epoch 1 of "four" is a normal 4-rank epoch.
  EXPECT_EQ(again[0]->Consume(1), 1);
  ASSERT_EQ(again[0]->begins.size(), 2u);
  EXPECT_EQ(again[0]->begins[1].epoch(), 1);
  EXPECT_EQ(again[0]->begins[1].samples_for_rank(), 12);
}

TEST_F(CoordinatorServiceTest, BadCursorsGetTheDocumentedCodes) {
  ASSERT_OK(service_->CreateJob(Spec("j", {10, 10}, 2, 0)));
  ASSERT_OK(service_->CreateJob(Spec("other", {10, 11}, 2, 0)));
  SimTrainer a(*service_, "j", 0, "a");
  ASSERT_EQ(a.Consume(3), 3);
  auto try_cursor = [&](const v1::Cursor& c) {
    SimTrainer t(*service_, "j", 1, "t", &c);
    return t.sink->finished.value_or(absl::OkStatus());
  };
  EXPECT_THAT(try_cursor(MakeCursor("nope", 0, 2, {0, 0})),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("hello.cursor.job: job nope")));
  EXPECT_THAT(try_cursor(MakeCursor("j", 0, 2, {3, -1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("consumed_per_rank[1]=-1 is unknown")));
  EXPECT_THAT(try_cursor(MakeCursor("j", 0, 2, {4, 0})),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("consumed_per_rank[0]=4 but rank 0 of job j "
                                 "acknowledged only 3")));
  EXPECT_THAT(try_cursor(MakeCursor("j", 5, 2, {0, 0})),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("hello.cursor.epoch=5")));
  EXPECT_THAT(try_cursor(MakeCursor("j", 0, 3, {0, 0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("hello.cursor.world_size=3")));
  EXPECT_THAT(try_cursor(MakeCursor("other", 0, 2, {0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job other has a different manifest")));
  // Nothing moved.
  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().ranks(0).consumed(), 3);
}

}  // namespace
}  // namespace sluice
