#include "server/coordinator/plan_ahead.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/job_spec.h"
#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using v1::internal::JournalRecord;

// A job of `shards` shards of 10 samples, units of at most 4.
JournalRecord Created(const std::string& name, int shards, int32_t world_size,
                      v1::Mode mode, int num_epochs) {
  v1::JobSpec spec;
  spec.set_name(name);
  for (int i = 0; i < shards; ++i) {
    auto* shard = spec.mutable_manifest()->add_shards();
    shard->set_url("/data/" + std::to_string(i) + ".tar");
    shard->set_num_samples(10);
  }
  spec.set_world_size(world_size);
  spec.set_mode(mode);
  spec.set_num_epochs(num_epochs);
  spec.set_shuffle(true);
  spec.set_seed(11);
  spec.set_max_samples_per_lease(4);
  auto normalized = NormalizeJobSpec(spec);
  EXPECT_TRUE(normalized.ok()) << normalized.status();
  JournalRecord r;
  *r.mutable_job_created()->mutable_spec() = *normalized;
  return r;
}

JournalRecord Advanced(const std::string& job, int64_t epoch) {
  JournalRecord r;
  r.mutable_epoch_advanced()->set_job(job);
  r.mutable_epoch_advanced()->set_epoch(epoch);
  return r;
}

JournalRecord WorkersSet(const std::string& job, int32_t workers) {
  JournalRecord r;
  r.mutable_workers_set()->set_job(job);
  r.mutable_workers_set()->set_epoch(0);
  r.mutable_workers_set()->set_workers_per_rank(workers);
  return r;
}

std::vector<PlannedUnit> Units(const EpochPlan& plan) { return plan.units; }

std::vector<std::vector<std::pair<int64_t, int64_t>>> Ranges(
    const std::vector<std::deque<Piece>>& queues) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> out;
  for (const auto& q : queues) {
    out.emplace_back();
    for (const Piece& p : q) {
      out.back().emplace_back(p.sequence * 1000 + p.begin,
                              p.slot * 1000 + p.end);
    }
  }
  return out;
}

// The queues built from a plan made ahead are those the state's pending
// pieces give for the same fresh epoch: per slot for a static job with a
// world size, one queue for a dynamic one.
TEST(PlanAheadTest, FreshQueuesAreTheFreshEpochsPendingPieces) {
  for (const v1::Mode mode : {v1::MODE_STATIC, v1::MODE_DYNAMIC}) {
    CoordinatorState state;
    ASSERT_OK(state.Apply(Created("j", 7, 3, mode, 0)));
    ASSERT_OK(state.Apply(WorkersSet("j", 2)));
    const JobData* job = state.FindJob("j");
    const bool per_slot = mode == v1::MODE_STATIC;
    std::vector<std::deque<Piece>> expected(per_slot ? 6 : 1);
    for (const Piece& p : state.PendingPieces(*job))
      expected[per_slot ? p.slot : 0].push_back(p);
    const PlannedAhead planned =
        PlanAhead(job->InputsFor(job->options, 0), per_slot, 5);
    EXPECT_EQ(Ranges(planned.queues), Ranges(expected)) << mode;
    EXPECT_EQ(Units(planned.prepared.plan), Units(job->plan));
    EXPECT_EQ(planned.prepared.serial, 5u);
    EXPECT_EQ(planned.prepared.epoch, 0);
    EXPECT_EQ(planned.prepared.options, job->options);
  }
}

// An epoch advance installs the plan offered for that epoch and those
// options (the job's plan_serial says which), and plans it itself when
// the offer is for other options or another epoch.
TEST(PlanAheadTest, AnEpochAdvanceInstallsTheMatchingOffer) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j", 5, 2, v1::MODE_STATIC, 0)));
  EXPECT_EQ(state.plans_computed(), 1);
  const JobData* job = state.FindJob("j");
  const EpochPlan expected = job->PlanOf(job->options, 1);

  PlannedAhead ahead = PlanAhead(job->InputsFor(job->options, 1), true, 7);
  state.OfferPlan("j", std::move(ahead.prepared));
  EXPECT_TRUE(state.HasOfferedPlan("j", job->options, 1));
  ASSERT_OK(state.Apply(Advanced("j", 1)));
  EXPECT_EQ(job->plan_serial, 7u);
  EXPECT_EQ(Units(job->plan), Units(expected));
  EXPECT_EQ(state.plans_offered_taken(), 1);
  EXPECT_EQ(state.plans_computed(), 1);
  EXPECT_FALSE(state.HasOfferedPlan("j", job->options, 1));

  // Other options: not installed; kept while the readers per rank may
  // still change to its (its epoch), dropped once a later epoch starts.
  PlanOptions other = job->options;
  other.workers_per_rank = 3;
  state.OfferPlan("j", PlanAhead(job->InputsFor(other, 2), true, 8).prepared);
  ASSERT_OK(state.Apply(Advanced("j", 2)));
  EXPECT_EQ(job->plan_serial, 0u);
  EXPECT_EQ(job->plan.workers_per_rank, 1);
  EXPECT_EQ(state.plans_computed(), 2);
  EXPECT_TRUE(state.HasOfferedPlan("j", other, 2));

  // An offer for a later epoch waits for it.
  state.OfferPlan("j",
                  PlanAhead(job->InputsFor(job->options, 4), true, 9).prepared);
  ASSERT_OK(state.Apply(Advanced("j", 3)));
  EXPECT_EQ(job->plan_serial, 0u);
  EXPECT_FALSE(state.HasOfferedPlan("j", other, 2));
  EXPECT_TRUE(state.HasOfferedPlan("j", job->options, 4));
  ASSERT_OK(state.Apply(Advanced("j", 4)));
  EXPECT_EQ(job->plan_serial, 9u);
  EXPECT_EQ(Units(job->plan), Units(job->PlanOf(job->options, 4)));

  // An offer for an epoch already past, or for a job that does not exist,
  // is not kept.
  state.OfferPlan(
      "j", PlanAhead(job->InputsFor(job->options, 3), true, 10).prepared);
  EXPECT_FALSE(state.HasOfferedPlan("j", job->options, 3));
  state.OfferPlan("none",
                  PreparedPlan{job->options, 5, {}, 11, nullptr, nullptr});
  EXPECT_FALSE(state.HasOfferedPlan("none", job->options, 5));
}

// A job keeps its latest few offers: a plan for the readers per rank
// offered while the next epoch's is also on offer is not lost.
TEST(PlanAheadTest, AJobKeepsItsLatestOffers) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j", 5, 2, v1::MODE_STATIC, 0)));
  const JobData* job = state.FindJob("j");
  std::vector<PlanOptions> options;
  for (int32_t w = 1; w <= 5; ++w) {
    options.push_back(job->options);
    options.back().workers_per_rank = w;
    state.OfferPlan("j", PreparedPlan{options.back(),
                                      1,
                                      {},
                                      static_cast<uint64_t>(w),
                                      job->shard_samples,
                                      job->mix});
  }
  EXPECT_FALSE(state.HasOfferedPlan("j", options[0], 1));  // the oldest
  EXPECT_FALSE(state.HasOfferedSerial("j", 1));
  for (int w = 2; w <= 5; ++w) {
    EXPECT_TRUE(state.HasOfferedPlan("j", options[w - 1], 1)) << w;
    EXPECT_TRUE(state.HasOfferedSerial("j", static_cast<uint64_t>(w))) << w;
  }
  // Offered again for the same epoch and options: replaced, not added.
  state.OfferPlan(
      "j", PreparedPlan{options[4], 1, {}, 9, job->shard_samples, job->mix});
  EXPECT_FALSE(state.HasOfferedSerial("j", 5));
  EXPECT_TRUE(state.HasOfferedSerial("j", 9));
  EXPECT_TRUE(state.HasOfferedSerial("j", 2));
}

// Setting the readers per rank installs the plan offered for them.
TEST(PlanAheadTest, SettingTheReadersPerRankInstallsTheMatchingOffer) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j", 5, 2, v1::MODE_DYNAMIC, 0)));
  const JobData* job = state.FindJob("j");
  PlanOptions four = job->options;
  four.workers_per_rank = 4;
  state.OfferPlan("j", PlanAhead(job->InputsFor(four, 0), false, 3).prepared);
  ASSERT_OK(state.Apply(WorkersSet("j", 4)));
  EXPECT_EQ(job->plan_serial, 3u);
  EXPECT_EQ(job->plan.workers_per_rank, 4);
  EXPECT_EQ(Units(job->plan), Units(job->PlanOf(four, 0)));
  EXPECT_EQ(state.plans_offered_taken(), 1);
}

// A job deleted, or created again under its name, leaves no offer behind:
// the new job's epochs are planned from its own manifest.
TEST(PlanAheadTest, AnOfferGoesWithItsJob) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j", 5, 2, v1::MODE_STATIC, 0)));
  const PlanOptions options = state.FindJob("j")->options;
  state.OfferPlan(
      "j",
      PlanAhead(state.FindJob("j")->InputsFor(options, 1), true, 4).prepared);
  JournalRecord deleted;
  deleted.mutable_job_deleted()->set_job("j");
  ASSERT_OK(state.Apply(deleted));
  EXPECT_FALSE(state.HasOfferedPlan("j", options, 1));

  ASSERT_OK(state.Apply(Created("j", 5, 2, v1::MODE_STATIC, 0)));
  state.OfferPlan(
      "j",
      PlanAhead(state.FindJob("j")->InputsFor(options, 1), true, 6).prepared);
  // Journaled again over it (a replay of a journal that holds both).
  ASSERT_OK(state.Apply(Created("j", 9, 2, v1::MODE_STATIC, 0)));
  EXPECT_FALSE(state.HasOfferedPlan("j", options, 1));
  ASSERT_OK(state.Apply(Advanced("j", 1)));
  const JobData* job = state.FindJob("j");
  EXPECT_EQ(job->plan_serial, 0u);
  EXPECT_EQ(job->plan.total_samples, 90);
}

// A plan computed ahead for a job that is deleted and created again under
// its name (other shards, the same options) while the plan is computed is
// the old job's: the new job refuses it and plans its epoch itself.
TEST(PlanAheadTest, APlanComputedForADeletedJobIsNotItsSuccessors) {
  CoordinatorState state;
  ASSERT_OK(state.Apply(Created("j", 5, 2, v1::MODE_STATIC, 0)));
  const PlanOptions options = state.FindJob("j")->options;
  PlannedAhead stale =
      PlanAhead(state.FindJob("j")->InputsFor(options, 1), true, 4);
  JournalRecord deleted;
  deleted.mutable_job_deleted()->set_job("j");
  ASSERT_OK(state.Apply(deleted));
  ASSERT_OK(state.Apply(Created("j", 9, 2, v1::MODE_STATIC, 0)));
  const JobData* job = state.FindJob("j");
  ASSERT_EQ(job->options, options);

  state.OfferPlan("j", std::move(stale.prepared));
  EXPECT_FALSE(state.HasOfferedPlan("j", options, 1));
  EXPECT_FALSE(state.HasOfferedSerial("j", 4));
  ASSERT_OK(state.Apply(Advanced("j", 1)));
  EXPECT_EQ(job->plan_serial, 0u);
  EXPECT_EQ(job->plan.total_samples, 90);
  EXPECT_EQ(Units(job->plan), Units(job->PlanOf(options, 1)));
}

}  // namespace
}  // namespace sluice
