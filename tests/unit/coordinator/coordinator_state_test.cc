#include "server/coordinator/coordinator_state.h"

#include <google/protobuf/util/message_differencer.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/job_spec.h"
#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using v1::internal::JournalRecord;

JournalRecord Created(const std::string& name) {
  v1::JobSpec spec;
  spec.set_name(name);
  auto* shard = spec.mutable_manifest()->add_shards();
  shard->set_url("/data/a.tar");
  shard->set_num_samples(8);
  spec.set_world_size(1);
  auto normalized = NormalizeJobSpec(spec);
  EXPECT_TRUE(normalized.ok()) << normalized.status();
  JournalRecord r;
  *r.mutable_job_created()->mutable_spec() = *normalized;
  return r;
}

JournalRecord Granted(const std::string& job, uint64_t fence) {
  JournalRecord r;
  auto* g = r.mutable_lease_granted();
  g->set_job(job);
  g->set_epoch(0);
  g->set_rank(0);
  g->set_sequence(0);
  g->set_shard_index(0);
  g->set_begin(0);
  g->set_end(8);
  g->set_fence(fence);
  g->set_lease_id(job + "/e0/f" + std::to_string(fence));
  g->set_holder("t0");
  return r;
}

JournalRecord Deleted(const std::string& job) {
  JournalRecord r;
  r.mutable_job_deleted()->set_job(job);
  return r;
}

// Data servers refuse a fence older than one they saw for the same unit
// (job, epoch, unit), so a job created again under a deleted job's name must
// not start its fences over: they continue above every fence granted.
TEST(CoordinatorStateTest,
     AJobCreatedAgainUnderItsNameContinuesAboveTheOldFences) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j")));
  ASSERT_OK(state.Apply(Created("other")));
  EXPECT_EQ(state.FindJob("j")->next_fence, 1u);
  ASSERT_OK(state.Apply(Granted("j", 7)));
  ASSERT_OK(state.Apply(Granted("other", 3)));
  ASSERT_OK(state.Apply(Deleted("j")));
  // Replayed from a snapshot taken now, the deleted job's fences are
  // remembered too (its records are compacted away).
  CoordinatorState restored;
  ASSERT_OK(restored.Apply(state.Snapshot()));

  ASSERT_OK(state.Apply(Created("j")));
  EXPECT_EQ(state.FindJob("j")->next_fence, 8u);
  ASSERT_OK(restored.Apply(Created("j")));
  EXPECT_EQ(restored.FindJob("j")->next_fence, 8u);
  // A job's own fences are untouched by the floor.
  EXPECT_EQ(restored.FindJob("other")->next_fence, 4u);
}

// A snapshot written before the floor existed (field unset) still bounds
// new jobs by the fences of the jobs it holds.
TEST(CoordinatorStateTest, ASnapshotWithoutTheFloorIsBoundedByItsJobs) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j")));
  ASSERT_OK(state.Apply(Granted("j", 41)));
  JournalRecord old = state.Snapshot();
  old.mutable_snapshot()->clear_next_fence_floor();
  CoordinatorState restored;
  ASSERT_OK(restored.Apply(old));
  ASSERT_OK(restored.Apply(Created("k")));
  EXPECT_EQ(restored.FindJob("k")->next_fence, 42u);
}

JournalRecord OnceDone(const std::string& scope, const std::string& name) {
  JournalRecord r;
  r.mutable_once_finished()->set_scope(scope);
  r.mutable_once_finished()->set_name(name);
  r.mutable_once_finished()->set_run(1);
  r.mutable_once_finished()->set_result("ok");
  return r;
}

// OnceReset forgets exactly the step it names; a snapshot taken after it
// (what a compaction writes) no longer holds the step either.
TEST(CoordinatorStateTest, OnceResetForgetsTheStepThroughSnapshots) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(OnceDone("job", "prep")));
  ASSERT_OK(state.Apply(OnceDone("job", "index")));
  ASSERT_OK(state.Apply(OnceDone("other", "prep")));
  JournalRecord reset;
  reset.mutable_once_reset()->set_scope("job");
  reset.mutable_once_reset()->set_name("prep");
  ASSERT_OK(state.Apply(std::move(reset)));
  EXPECT_EQ(state.FindOnceFinished("job", "prep"), nullptr);
  EXPECT_NE(state.FindOnceFinished("job", "index"), nullptr);
  EXPECT_NE(state.FindOnceFinished("other", "prep"), nullptr);
  std::vector<std::string> in_job;
  for (const auto& f : state.OnceFinishedIn("job")) in_job.push_back(f.name());
  EXPECT_EQ(in_job, (std::vector<std::string>{"index"}));
  EXPECT_EQ(state.OnceFinishedIn("").size(), 2u);

  CoordinatorState replayed;
  ASSERT_OK(replayed.Apply(state.Snapshot()));
  EXPECT_EQ(replayed.FindOnceFinished("job", "prep"), nullptr);
  EXPECT_EQ(replayed.OnceFinishedIn("").size(), 2u);
}

// A step is its (scope, name): "a/b" + "c" and "a" + "b/c" are two steps,
// before and after a snapshot.
TEST(CoordinatorStateTest, OnceStepsWhoseJoinedNamesMatchAreKeptApart) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(OnceDone("a/b", "c")));
  EXPECT_EQ(state.FindOnceFinished("a", "b/c"), nullptr);
  ASSERT_OK(state.Apply(OnceDone("a", "b/c")));
  JournalRecord reset;
  reset.mutable_once_reset()->set_scope("a/b");
  reset.mutable_once_reset()->set_name("c");
  ASSERT_OK(state.Apply(std::move(reset)));
  EXPECT_EQ(state.FindOnceFinished("a/b", "c"), nullptr);
  ASSERT_NE(state.FindOnceFinished("a", "b/c"), nullptr);
  CoordinatorState replayed;
  ASSERT_OK(replayed.Apply(state.Snapshot()));
  ASSERT_EQ(replayed.OnceFinishedIn("").size(), 1u);
  EXPECT_EQ(replayed.OnceFinishedIn("")[0].scope(), "a");
  EXPECT_EQ(replayed.OnceFinishedIn("")[0].name(), "b/c");
}

// One test per journal record: what applying it does to the state, and the
// error a record that does not fit the state gets.

using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

JournalRecord Acked(const std::string& job, uint64_t fence, int64_t begin,
                    int64_t consumed, bool complete) {
  JournalRecord r;
  auto* a = r.mutable_unit_acked();
  a->set_job(job);
  a->set_epoch(0);
  a->set_rank(0);
  a->set_worker(0);
  a->set_sequence(0);
  a->set_shard_index(0);
  a->set_begin(begin);
  a->set_consumed(consumed);
  a->set_complete(complete);
  a->set_fence(fence);
  a->set_lease_id(job + "/e0/f" + std::to_string(fence));
  return r;
}

JournalRecord Advanced(const std::string& job, int64_t epoch) {
  JournalRecord r;
  r.mutable_epoch_advanced()->set_job(job);
  r.mutable_epoch_advanced()->set_epoch(epoch);
  return r;
}

TEST(CoordinatorStateRecordTest,
     JobCreatedPlansEpochZeroWithEverythingPending) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j")));
  const JobData* job = state.FindJob("j");
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->epoch, 0);
  EXPECT_FALSE(job->done);
  EXPECT_EQ(job->served_per_epoch(), 8);
  EXPECT_EQ(job->consumed_total, 0);
  int64_t pending = 0;
  for (const Piece& p : state.PendingPieces(*job)) pending += p.end - p.begin;
  EXPECT_EQ(pending, 8);
}

TEST(CoordinatorStateRecordTest, LeaseGrantedHoldsItsRangeOutOfThePendingWork) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j")));
  ASSERT_OK(state.Apply(Granted("j", 5)));
  const JobData* job = state.FindJob("j");
  ASSERT_EQ(job->leases.count("j/e0/f5"), 1u);
  EXPECT_EQ(job->leases.at("j/e0/f5").holder, "t0");
  EXPECT_EQ(job->next_fence, 6u);
  EXPECT_TRUE(state.PendingPieces(*job).empty());
  // A grant for a job (or an epoch) the state does not have is refused,
  // naming the lease.
  EXPECT_THAT(state.Apply(Granted("nope", 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("lease nope/e0/f1")));
}

TEST(CoordinatorStateRecordTest,
     UnitAckedCountsThePrefixAndACompleteEndsTheLease) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j")));
  ASSERT_OK(state.Apply(Granted("j", 1)));
  ASSERT_OK(state.Apply(Acked("j", 1, 0, 3, false)));
  const JobData* job = state.FindJob("j");
  EXPECT_EQ(job->consumed_total, 3);
  EXPECT_EQ(job->consumed_by_rank(0), 3);
  ASSERT_EQ(job->leases.count("j/e0/f1"), 1u);
  EXPECT_EQ(job->leases.at("j/e0/f1").acked, 3);
  ASSERT_OK(state.Apply(Acked("j", 1, 3, 5, true)));
  EXPECT_EQ(job->consumed_total, 8);
  EXPECT_TRUE(job->leases.empty());
  EXPECT_TRUE(job->epoch_complete());
  // An ack for a lease the state does not hold is refused, naming it.
  EXPECT_THAT(state.Apply(Acked("j", 1, 0, 1, false)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("unknown lease j/e0/f1")));
  EXPECT_EQ(job->consumed_total, 8);
}

TEST(CoordinatorStateRecordTest,
     LeaseEndedReturnsTheUnackedRemainderToPending) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j")));
  ASSERT_OK(state.Apply(Granted("j", 1)));
  ASSERT_OK(state.Apply(Acked("j", 1, 0, 2, false)));
  JournalRecord ended;
  ended.mutable_lease_ended()->set_job("j");
  ended.mutable_lease_ended()->set_lease_id("j/e0/f1");
  ended.mutable_lease_ended()->set_reason(v1::internal::LEASE_END_EXPIRED);
  ASSERT_OK(state.Apply(ended));
  const JobData* job = state.FindJob("j");
  EXPECT_TRUE(job->leases.empty());
  std::vector<std::pair<int64_t, int64_t>> pending;
  for (const Piece& p : state.PendingPieces(*job))
    pending.emplace_back(p.begin, p.end);
  EXPECT_EQ(pending, (std::vector<std::pair<int64_t, int64_t>>{{2, 8}}));
  // Ending a lease of a job that is gone changes nothing.
  ended.mutable_lease_ended()->set_job("gone");
  EXPECT_OK(state.Apply(ended));
}

// Journals written when LeaseEnded carried its reason as a string (field 3)
// replay the same: the field is skipped, and Apply never needed it.
TEST(CoordinatorStateRecordTest, ALeaseEndedWithAStringReasonStillReplays) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j")));
  ASSERT_OK(state.Apply(Granted("j", 1)));
  v1::internal::LeaseEnded current;
  current.set_job("j");
  current.set_lease_id("j/e0/f1");
  // Field 3, length-delimited: "expired".
  const std::string old_bytes = current.SerializeAsString() +
                                "\x1a\x07"
                                "expired";
  JournalRecord ended;
  ASSERT_TRUE(ended.mutable_lease_ended()->ParseFromString(old_bytes));
  EXPECT_EQ(ended.lease_ended().reason(), v1::internal::LEASE_END_UNSPECIFIED);
  ASSERT_OK(state.Apply(ended));
  EXPECT_TRUE(state.FindJob("j")->leases.empty());
}

TEST(CoordinatorStateRecordTest, EpochAdvancedStartsTheEpochAfresh) {
  CoordinatorState state;
  JournalRecord created = Created("j");
  created.mutable_job_created()->mutable_spec()->set_num_epochs(2);
  ASSERT_OK(state.Apply(created));
  ASSERT_OK(state.Apply(Granted("j", 1)));
  ASSERT_OK(state.Apply(Acked("j", 1, 0, 8, true)));
  ASSERT_OK(state.Apply(Advanced("j", 1)));
  const JobData* job = state.FindJob("j");
  EXPECT_EQ(job->epoch, 1);
  EXPECT_FALSE(job->done);
  EXPECT_EQ(job->consumed_total, 0);
  EXPECT_EQ(job->consumed_by_rank(0), 0);
  EXPECT_TRUE(job->leases.empty());
  EXPECT_EQ(job->next_fence, 2u);  // fences keep rising across epochs
  ASSERT_OK(state.Apply(Advanced("j", 2)));
  EXPECT_TRUE(state.FindJob("j")->done);
  EXPECT_THAT(state.Apply(Advanced("nope", 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("unknown job nope")));
}

TEST(CoordinatorStateRecordTest, JobDeletedForgetsTheJob) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j")));
  ASSERT_OK(state.Apply(Granted("j", 1)));
  ASSERT_OK(state.Apply(Deleted("j")));
  EXPECT_EQ(state.FindJob("j"), nullptr);
  EXPECT_TRUE(state.jobs().empty());
}

// The coordinator journals a record only after the state accepted it, so a
// refused record must leave the state exactly as it was.
// A reader's unacknowledged granted samples (what its quota check adds to
// what it consumed) follow grants, acknowledgements, ends, epochs and
// snapshots, as a walk over the job's leases counts them.
TEST(CoordinatorStateRecordTest, OutstandingSamplesFollowTheLeases) {
  auto walk = [](const JobData& job) {
    int64_t n = 0;
    for (const auto& [id, l] : job.leases) n += (l.end - l.begin) - l.acked;
    return n;
  };
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j")));
  ASSERT_OK(state.Apply(Granted("j", 1)));
  EXPECT_EQ(state.FindJob("j")->outstanding_of(0, 0), 8);
  ASSERT_OK(state.Apply(Acked("j", 1, 0, 3, false)));
  EXPECT_EQ(state.FindJob("j")->outstanding_of(0, 0), 5);
  EXPECT_EQ(state.FindJob("j")->outstanding_of(0, 0),
            walk(*state.FindJob("j")));
  CoordinatorState restored;
  ASSERT_OK(restored.Apply(state.Snapshot()));
  EXPECT_EQ(restored.FindJob("j")->outstanding_of(0, 0), 5);
  JournalRecord ended;
  ended.mutable_lease_ended()->set_job("j");
  ended.mutable_lease_ended()->set_lease_id("j/e0/f1");
  ASSERT_OK(state.Apply(ended));
  EXPECT_EQ(state.FindJob("j")->outstanding_of(0, 0), 0);
  ASSERT_OK(state.Apply(Granted("j", 2)));
  ASSERT_OK(state.Apply(Acked("j", 2, 0, 8, true)));
  EXPECT_EQ(state.FindJob("j")->outstanding_of(0, 0), 0);
  ASSERT_OK(restored.Apply(Advanced("j", 1)));
  EXPECT_EQ(restored.FindJob("j")->outstanding_of(0, 0), 0);
  EXPECT_TRUE(restored.FindJob("j")->outstanding.empty());
}

TEST(CoordinatorStateRecordTest, ARefusedRecordChangesNothing) {
  CoordinatorState state;
  JournalRecord created = Created("j");
  created.mutable_job_created()->mutable_spec()->set_num_epochs(2);
  ASSERT_OK(state.Apply(created));
  ASSERT_OK(state.Apply(Granted("j", 1)));
  ASSERT_OK(state.Apply(Acked("j", 1, 0, 3, false)));
  const JournalRecord before = state.Snapshot();
  JournalRecord wrong_epoch = Granted("j", 2);
  wrong_epoch.mutable_lease_granted()->set_epoch(1);
  JournalRecord workers;
  workers.mutable_workers_set()->set_job("j");
  workers.mutable_workers_set()->set_epoch(0);
  workers.mutable_workers_set()->set_workers_per_rank(2);  // leases are out
  JournalRecord resume;
  resume.mutable_job_resumed()->set_job("nope");
  for (const JournalRecord& refused :
       {Granted("nope", 2), wrong_epoch, Acked("j", 9, 0, 1, false),
        Acked("nope", 1, 0, 1, false), Advanced("nope", 1), workers, resume,
        JournalRecord()}) {
    EXPECT_FALSE(state.Apply(refused).ok()) << refused.ShortDebugString();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
        state.Snapshot(), before))
        << refused.ShortDebugString();
  }
}

// A copy takes every field from the job it copies but its name and world
// size: anything else in the request is refused, naming the field.
TEST(CopyJobRequestTest, OnlyTheNameAndWorldSizeMayBeGiven) {
  v1::CreateJobRequest request;
  request.set_copy_of("imagenet");
  request.mutable_spec()->set_world_size(3);
  EXPECT_THAT(CheckCopyRequest(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.name: the copy's name is required")));
  request.mutable_spec()->set_name(CopyJobName("imagenet", 3));
  EXPECT_EQ(request.spec().name(), "imagenet.w3");
  EXPECT_OK(CheckCopyRequest(request));
  request.mutable_spec()->set_seed(7);
  EXPECT_THAT(CheckCopyRequest(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.seed: a copy of job \"imagenet\"")));
  request.mutable_spec()->clear_seed();
  request.mutable_spec()->mutable_manifest()->add_shards()->set_url("/x.tar");
  EXPECT_THAT(
      CheckCopyRequest(request),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec.manifest")));
}

TEST(CoordinatorStateRecordTest, AnEmptyRecordIsRefused) {
  CoordinatorState state;
  EXPECT_THAT(state.Apply(JournalRecord()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("empty journal record")));
}

}  // namespace
}  // namespace sluice
