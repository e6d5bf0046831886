#include "server/coordinator/coordinator_state.h"

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

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

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

}  // namespace
}  // namespace sluice
