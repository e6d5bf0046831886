// CoordinatorService: Sessions, epochs and the messages of one job.
#include "server/coordinator/coordinator_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
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
#include "server/common/work_unit.h"
#include "server/coordinator/coordinator_metrics.h"
#include "tests/testing/coordinator_fixture.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/gated_journal.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::Complete;
using ::sluice::testing::CoordinatorServiceTest;
using ::sluice::testing::Hello;
using ::sluice::testing::OpenAndWantOne;
using ::sluice::testing::Progress;
using ::sluice::testing::RecordingSink;
using ::sluice::testing::SimTrainer;
using ::sluice::testing::Spec;
using ::sluice::testing::StatusIs;
using ::sluice::testing::Tally;
using ::sluice::testing::Want;
using ::testing::HasSubstr;

// Four ranks consume three epochs; every served sample is acknowledged
// exactly once per epoch and the ranks get identical counts (G1-G3).
TEST_F(CoordinatorServiceTest, ThreeEpochsCoverEverySampleOnceWithEqualRanks) {
  ASSERT_OK(
      service_->CreateJob(Spec("j", {7, 0, 1, 13, 5, 9}, 4, 3)));  // T = 35
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<int64_t> ids;
  for (int r = 0; r < 4; ++r) {
    sinks.push_back(std::make_shared<RecordingSink>());
    ids.push_back(service_->OpenSession(sinks.back()));
    service_->OnMessage(ids[r], Hello("j", r, "t" + std::to_string(r)));
    service_->OnMessage(ids[r], Want(2));
  }
  std::map<int64_t, std::map<std::pair<int, int64_t>, int>>
      seen;  // epoch -> sample -> n
  std::map<int64_t, std::vector<int64_t>> per_rank;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < 4; ++r) {
      for (const v1::Lease& lease : sinks[r]->TakeGrants()) {
        progress = true;
        EXPECT_EQ(lease.rank(), r);
        auto& counts = per_rank[lease.epoch()];
        counts.resize(4);
        counts[r] += lease.unit().end() - lease.unit().begin();
        for (int64_t k = lease.unit().begin(); k < lease.unit().end(); ++k) {
          ++seen[lease.epoch()][{UnitIndex(lease.unit()), k}];
        }
        service_->OnMessage(ids[r], Complete(lease));
      }
    }
  }
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& [epoch, samples] : seen) {
    EXPECT_EQ(samples.size(), 32u) << "epoch " << epoch;  // 35 - 3 dropped
    for (const auto& [sample, n] : samples) EXPECT_EQ(n, 1);
    EXPECT_EQ(per_rank[epoch], (std::vector<int64_t>{8, 8, 8, 8}));
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(sinks[r]->Count(v1::CoordinatorMessage::kEpochBegin), 3);
    EXPECT_EQ(sinks[r]->Count(v1::CoordinatorMessage::kEpochEnd), 3);
    EXPECT_EQ(sinks[r]->Count(v1::CoordinatorMessage::kJobDone), 1);
    ASSERT_TRUE(sinks[r]->finished.has_value());
    EXPECT_OK(*sinks[r]->finished);
  }
  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().state(), v1::JOB_STATE_DONE);
}

// The plan of every epoch after the first, and of the first once the
// readers per rank are known, is made outside the state lock before the
// record that installs it; the epochs granted are exactly the plans.
TEST_F(CoordinatorServiceTest, EpochsArePlannedAheadOfTheirRecords) {
  v1::JobSpec spec = Spec("j", {7, 0, 1, 13, 5, 9}, 2, 3);
  spec.set_mode(v1::MODE_STATIC);
  spec.set_max_samples_per_lease(3);
  ASSERT_OK(service_->CreateJob(spec));
  EXPECT_EQ(service_->PlansTakenAndComputed(),
            (std::pair<int64_t, int64_t>{0, 1}));  // CreateJob's own
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<int64_t> ids;
  for (int r = 0; r < 2; ++r) {
    for (int w = 0; w < 2; ++w) {
      sinks.push_back(std::make_shared<RecordingSink>());
      ids.push_back(service_->OpenSession(sinks.back()));
      v1::TrainerMessage hello = Hello("j", r, absl::StrCat("t", r, "-", w));
      hello.mutable_hello()->set_worker(w);
      hello.mutable_hello()->set_num_workers(2);
      service_->OnMessage(ids.back(), hello);
      service_->OnMessage(ids.back(), Want(2));
    }
  }
  // The first Hello planned epoch 0 for two readers per rank outside the
  // lock; the others found the readers set.
  EXPECT_EQ(service_->PlansTakenAndComputed(),
            (std::pair<int64_t, int64_t>{1, 1}));
  using Unit = std::tuple<int64_t, int32_t, int64_t, int64_t, int32_t>;
  std::map<int64_t, std::vector<Unit>> granted;  // by epoch
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t i = 0; i < sinks.size(); ++i) {
      for (const v1::Lease& lease : sinks[i]->TakeGrants()) {
        progress = true;
        granted[lease.epoch()].emplace_back(
            lease.epoch(), UnitIndex(lease.unit()), lease.unit().begin(),
            lease.unit().end(), lease.rank());
        service_->WaitForPlansAhead();  // the next epoch's plan is on offer
        service_->OnMessage(ids[i], Complete(lease));
      }
    }
  }
  // Epochs 1 and 2, and 3, the finished job's.
  EXPECT_EQ(service_->PlansTakenAndComputed(),
            (std::pair<int64_t, int64_t>{4, 1}));
  // What the state plans itself for the same job and readers.
  auto job = service_->GetJob("j", true);
  ASSERT_OK(job);
  CoordinatorState reference;
  v1::internal::JournalRecord created;
  *created.mutable_job_created()->mutable_spec() = job->spec();
  ASSERT_OK(reference.Apply(created));
  PlanOptions two = reference.FindJob("j")->options;
  two.workers_per_rank = 2;
  ASSERT_EQ(granted.size(), 3u);
  for (auto& [epoch, units] : granted) {
    std::vector<Unit> planned;
    for (const PlannedUnit& u :
         reference.FindJob("j")->PlanOf(two, epoch).units) {
      planned.emplace_back(epoch, u.shard_index, u.begin, u.end, u.rank);
    }
    std::sort(units.begin(), units.end());
    std::sort(planned.begin(), planned.end());
    EXPECT_EQ(units, planned) << "epoch " << epoch;
  }
}

TEST_F(CoordinatorServiceTest, StaleFenceIsRejectedWithAborted) {
  ASSERT_OK(service_->CreateJob(Spec("j", {10}, 0, 1)));
  auto a = std::make_shared<RecordingSink>();
  const int64_t id = OpenAndWantOne(*service_, a);
  v1::Lease lease = a->TakeGrants().at(0);
  lease.set_fence(lease.fence() + 7);
  service_->OnMessage(id, Progress(lease, 1));
  ASSERT_EQ(a->Count(v1::CoordinatorMessage::kRejected), 1);
  for (const auto& m : a->inbox) {
    if (m.has_rejected()) {
      EXPECT_EQ(m.rejected().code(),
                static_cast<int>(absl::StatusCode::kAborted));
      EXPECT_THAT(m.rejected().message(), HasSubstr(lease.lease_id()));
    }
  }
  EXPECT_FALSE(a->finished.has_value());  // the stream goes on
}

// A Progress reporting a lease's last sample ends the epoch when it was the
// epoch's last; the Complete that follows it (a reader's usual order) is
// accepted as the lease's end, not refused as an ack for a past epoch.
TEST_F(CoordinatorServiceTest,
       ACompleteAfterTheEpochsLastProgressEndsTheLease) {
  ASSERT_OK(service_->CreateJob(Spec("j", {10}, 0, 2)));
  auto a = std::make_shared<RecordingSink>();
  const int64_t id = OpenAndWantOne(*service_, a);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<v1::Lease> grants = a->TakeGrants();
    ASSERT_EQ(grants.size(), 1u) << "epoch " << epoch;
    const v1::Lease lease = grants[0];
    EXPECT_EQ(lease.epoch(), epoch);
    ASSERT_EQ(lease.unit().end() - lease.unit().begin(), 10);
    service_->OnMessage(id, Progress(lease, 10));
    EXPECT_EQ(a->Count(v1::CoordinatorMessage::kEpochEnd), epoch + 1);
    service_->OnMessage(id, Complete(lease));
    EXPECT_EQ(a->Count(v1::CoordinatorMessage::kRejected), 0);
    if (epoch == 0) {
      EXPECT_FALSE(a->finished.has_value());
    }
  }
  ASSERT_TRUE(a->finished.has_value());
  EXPECT_OK(*a->finished);
  EXPECT_EQ(a->Count(v1::CoordinatorMessage::kJobDone), 1);
  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().state(), v1::JOB_STATE_DONE);
  EXPECT_EQ(job->status().leases().granted(), 2);
  EXPECT_EQ(job->status().leases().completed(), 2);
  clock_.Advance(absl::Seconds(3));  // past the TTL: no lease is left held
  EXPECT_EQ(service_->ExpireLeases(), 0);
  EXPECT_EQ(service_->GetJob("j", false)->status().leases().expired(), 0);
}

TEST_F(CoordinatorServiceTest, BadInputGetsTheDocumentedCodes) {
  EXPECT_THAT(service_->GetJob("nope", false),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(
      service_->CreateJob(Spec("e", {}, 1, 1)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec.manifest")));
  v1::JobSpec dup = Spec("d", {1, 2}, 1, 1);
  dup.mutable_manifest()->mutable_shards(1)->set_url("/data/shard-0.tar");
  EXPECT_THAT(service_->CreateJob(dup),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.manifest.shards[1].url")));
  v1::JobSpec scheme = Spec("s", {1}, 1, 1);
  scheme.mutable_manifest()->mutable_shards(0)->set_url("ftp://x/y.tar");
  EXPECT_THAT(
      service_->CreateJob(scheme),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shards[0].url")));
  v1::JobSpec sum = Spec("c", {1}, 1, 1);
  sum.mutable_manifest()->mutable_shards(0)->set_checksum("md5:0123");
  EXPECT_THAT(service_->CreateJob(sum),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.manifest.shards[0].checksum")));
  sum.mutable_manifest()->mutable_shards(0)->set_checksum("sha256:" +
                                                          std::string(64, 'a'));
  EXPECT_OK(service_->CreateJob(sum));
  EXPECT_THAT(service_->CreateJob(Spec("w", {1}, -1, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.world_size")));
  EXPECT_THAT(
      service_->CreateJob(Spec("bad name!", {1}, 1, 1)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec.name")));
  // Idempotent by name.
  ASSERT_OK(service_->CreateJob(Spec("j", {3}, 2, 1)));
  EXPECT_OK(service_->CreateJob(Spec("j", {3}, 2, 1)));
  EXPECT_THAT(service_->CreateJob(Spec("j", {3}, 3, 1)),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("j")));
  // rank >= world_size ends the session with INVALID_ARGUMENT.
  auto a = std::make_shared<RecordingSink>();
  service_->OnMessage(service_->OpenSession(a), Hello("j", 2, "t"));
  ASSERT_TRUE(a->finished.has_value());
  EXPECT_THAT(*a->finished, StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("hello.rank=2")));
  auto b = std::make_shared<RecordingSink>();
  service_->OnMessage(service_->OpenSession(b), Hello("zzz", 0, "t"));
  EXPECT_THAT(*b->finished,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("zzz")));
  EXPECT_THAT(service_->DeleteJob("zzz"),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(service_->DeleteJob("j"));
  EXPECT_THAT(service_->GetJob("j", false),
              StatusIs(absl::StatusCode::kNotFound));
}

// One request cannot make the coordinator plan or hold without bound, nor
// make its reply huge: each limit is INVALID_ARGUMENT naming the field and
// the limit, and a long input is quoted by a short prefix only.
TEST_F(CoordinatorServiceTest,
       RequestsBeyondTheLimitsAreRefusedWithShortMessages) {
  EXPECT_THAT(
      service_->CreateJob(Spec("w", {1}, 2147483647, 1)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(
                   "spec.world_size: 2147483647 is above the limit of 65536")));
  v1::JobSpec units = Spec("u", {1000000000000}, 1, 1);
  units.set_max_samples_per_lease(1);
  EXPECT_THAT(
      service_->CreateJob(units),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr(
              "spec.max_samples_per_lease: 1 cuts an epoch into more than")));
  v1::JobSpec overflow =
      Spec("o", {int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62}, 1, 1);
  EXPECT_THAT(service_->CreateJob(overflow),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.manifest.shards[0].num_samples")));
  const std::string huge(1 << 20, 'x');
  auto name = service_->CreateJob(Spec(huge + "!", {1}, 1, 1));
  EXPECT_THAT(name, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("spec.name")));
  EXPECT_LT(name.status().message().size(), 300u);
  v1::JobSpec url = Spec("url", {1}, 1, 1);
  url.mutable_manifest()->mutable_shards(0)->set_url("/" + huge);
  auto long_url = service_->CreateJob(url);
  EXPECT_THAT(long_url, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("shards[0].url")));
  EXPECT_LT(long_url.status().message().size(), 300u);

  ASSERT_OK(service_->CreateJob(Spec("j", {10}, 1, 1)));
  auto a = std::make_shared<RecordingSink>();
  service_->OnMessage(service_->OpenSession(a), Hello(huge, 0, "t"));
  ASSERT_TRUE(a->finished.has_value());
  EXPECT_THAT(*a->finished,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_LT(a->finished->message().size(), 300u);
  auto b = std::make_shared<RecordingSink>();
  service_->OnMessage(service_->OpenSession(b), Hello("j", 0, huge));
  ASSERT_TRUE(b->finished.has_value());
  EXPECT_THAT(*b->finished, StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("hello.trainer_id")));
  EXPECT_LT(b->finished->message().size(), 300u);
  // A 10 MB lease id is refused without being sent back.
  auto c = std::make_shared<RecordingSink>();
  const int64_t id = service_->OpenSession(c);
  service_->OnMessage(id, Hello("j", 0, "t"));
  v1::TrainerMessage progress;
  progress.mutable_progress()->mutable_lease()->set_lease_id(
      std::string(10 << 20, 'l'));
  progress.mutable_progress()->set_consumed(1);
  service_->OnMessage(id, progress);
  service_->Flush();
  ASSERT_EQ(c->Count(v1::CoordinatorMessage::kRejected), 1);
  for (const auto& m : c->inbox) {
    if (!m.has_rejected()) continue;
    EXPECT_EQ(m.rejected().code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_TRUE(m.rejected().lease_id().empty());
    EXPECT_THAT(m.rejected().message(), HasSubstr("lease.lease_id"));
    EXPECT_LT(m.ByteSizeLong(), 300u);
  }
  EXPECT_FALSE(c->finished.has_value());
}

// Dynamic mode: a fast rank cannot take more than its quota.
TEST_F(CoordinatorServiceTest, DynamicModeRespectsQuotas) {
  v1::JobSpec spec = Spec("j", {10, 10}, 2, 1);
  spec.set_mode(v1::MODE_DYNAMIC);
  ASSERT_OK(service_->CreateJob(spec));
  auto fast = std::make_shared<RecordingSink>();
  const int64_t id = service_->OpenSession(fast);
  service_->OnMessage(id, Hello("j", 0, "fast"));
  service_->OnMessage(id, Want(8));
  int64_t got = 0;
  bool more = true;
  while (more) {
    more = false;
    for (const v1::Lease& l : fast->TakeGrants()) {
      more = true;
      got += l.unit().end() - l.unit().begin();
      service_->OnMessage(id, Complete(l));
    }
  }
  EXPECT_EQ(got, 10);
  EXPECT_EQ(fast->Count(v1::CoordinatorMessage::kWaiting), 1);
  for (const auto& m : fast->inbox) {
    if (m.has_waiting()) {
      EXPECT_EQ(m.waiting().kind(), v1::WAITING_QUOTA_REACHED);
    }
  }
}

// A lease says its shards are shared while another job over the same set
// of shards (in any order) has a reader open; not for a job over other
// shards, nor once the other job's readers are gone.
TEST_F(CoordinatorServiceTest, LeasesSayTheirShardsAreSharedWhileATrialReads) {
  v1::JobSpec a = Spec("a", {10, 10, 10, 10, 10, 10}, 0, 1);
  v1::JobSpec b = Spec("b", {10, 10, 10, 10, 10, 10}, 0, 1);
  std::reverse(b.mutable_manifest()->mutable_shards()->begin(),
               b.mutable_manifest()->mutable_shards()->end());
  v1::JobSpec other = Spec("other", {10, 10}, 0, 1);
  for (v1::JobSpec* spec : {&a, &b, &other}) {
    spec->set_mode(v1::MODE_DYNAMIC);
    ASSERT_OK(service_->CreateJob(*spec));
  }
  const auto grant = [&](const std::string& job, const std::string& trainer) {
    auto sink = std::make_shared<RecordingSink>();
    const int64_t id = service_->OpenSession(sink);
    service_->OnMessage(id, Hello(job, 0, trainer));
    service_->OnMessage(id, Want(1));
    std::vector<v1::Lease> leases = sink->TakeGrants();
    EXPECT_EQ(leases.size(), 1u) << job;
    return std::make_pair(id, leases.empty() ? v1::Lease() : leases[0]);
  };
  auto [a1, alone] = grant("a", "t1");
  EXPECT_FALSE(alone.shared_shards());  // no other job has a reader
  auto [o1, unrelated] = grant("other", "t1");
  EXPECT_FALSE(unrelated.shared_shards());
  auto [a2, beside_other] = grant("a", "t2");
  EXPECT_FALSE(beside_other.shared_shards());  // other's shards differ
  auto [b1, trial] = grant("b", "t1");
  EXPECT_TRUE(trial.shared_shards());
  auto [a3, with_trial] = grant("a", "t3");
  EXPECT_TRUE(with_trial.shared_shards());
  service_->CloseSession(b1);
  auto [a4, after] = grant("a", "t4");
  EXPECT_FALSE(after.shared_shards());
  for (int64_t id : {a1, o1, a2, a3, a4}) service_->CloseSession(id);
}

TEST_F(CoordinatorServiceTest, SyncIsAnsweredAfterEarlierMessages) {
  ASSERT_OK(service_->CreateJob(Spec("j", {4}, 1, 1)));
  SimTrainer a(*service_, "j", 0, "a");
  ASSERT_EQ(a.Consume(2), 2);
  v1::TrainerMessage sync;
  sync.mutable_sync()->set_id(42);
  service_->OnMessage(a.session, sync);
  ASSERT_EQ(a.sink->Count(v1::CoordinatorMessage::kSynced), 1);
  EXPECT_EQ(a.sink->inbox.back().synced().id(), 42u);
}

// One process reading two jobs under one trainer_id: each job's leases stay
// with that job's session (a Hello in job b must not re-announce job a's).
TEST_F(CoordinatorServiceTest, ATrainerIdIsScopedToItsJob) {
  ASSERT_OK(service_->CreateJob(Spec("a", {5}, 1, 1)));
  ASSERT_OK(service_->CreateJob(Spec("b", {5}, 1, 1)));
  SimTrainer in_a(*service_, "a", 0, "same-id");
  ASSERT_EQ(in_a.held.size(), 1u);
  SimTrainer in_b(*service_, "b", 0, "same-id");
  ASSERT_EQ(in_b.held.size(), 1u);
  EXPECT_EQ(in_b.held.front().job(), "b");
  EXPECT_FALSE(in_a.sink->finished
                   .has_value());  // not replaced by the other job's session
  EXPECT_EQ(in_a.Consume(5), 5);
  EXPECT_EQ(in_b.Consume(5), 5);
}

// DataLoader workers: several sessions of one rank share its quota, in both
// modes; every sample of the epoch once, equal totals per rank.
TEST_F(CoordinatorServiceTest, SessionsOfOneRankShareItsQuota) {
  for (v1::Mode mode : {v1::MODE_STATIC, v1::MODE_DYNAMIC}) {
    const std::string name = v1::Mode_Name(mode);
    v1::JobSpec spec = Spec(name, {9, 14, 3, 11, 6}, 2, 1);  // T = 43, q = 21
    spec.set_mode(mode);
    spec.set_max_samples_per_lease(4);
    ASSERT_OK(service_->CreateJob(spec));
    std::vector<std::unique_ptr<SimTrainer>> workers;
    for (int r = 0; r < 2; ++r) {
      for (int w = 0; w < 3; ++w) {
        workers.push_back(std::make_unique<SimTrainer>(
            *service_, name, r, absl::StrCat("r", r, "w", w)));
      }
    }
    int64_t progress = 1;
    while (progress > 0) {
      progress = 0;
      for (auto& t : workers)
        progress += t->Consume(1);  // round-robin, like a DataLoader
    }
    std::vector<std::vector<std::tuple<int64_t, int32_t, int64_t>>> parts;
    int64_t per_rank[2] = {0, 0};
    for (size_t i = 0; i < workers.size(); ++i) {
      parts.push_back(workers[i]->consumed);
      per_rank[i / 3] += static_cast<int64_t>(workers[i]->consumed.size());
      EXPECT_FALSE(workers[i]->consumed.empty())
          << name << " worker " << i << " starved";
    }
    auto seen = Tally(parts);
    EXPECT_EQ(seen.size(), 42u) << name;
    for (const auto& [s, n] : seen) EXPECT_EQ(n, 1) << name;
    EXPECT_EQ(per_rank[0], 21) << name;
    EXPECT_EQ(per_rank[1], 21) << name;
  }
}

// DataLoader workers: each reads a fixed slot of its rank's quota (21 over
// 3 workers: 7 each, on both ranks), whatever the order they read in; a
// worker that has its slot is told so and granted nothing more, though the
// others still read (a DataLoader ends that worker's pass).
TEST_F(CoordinatorServiceTest, WorkersReadFixedSlotsOfTheirRanksQuota) {
  for (v1::Mode mode : {v1::MODE_STATIC, v1::MODE_DYNAMIC}) {
    const std::string name = absl::StrCat("w", v1::Mode_Name(mode));
    v1::JobSpec spec = Spec(name, {9, 14, 3, 11, 6}, 2, 1);  // T = 43, q = 21
    spec.set_mode(mode);
    spec.set_max_samples_per_lease(4);
    ASSERT_OK(service_->CreateJob(spec));
    std::vector<std::unique_ptr<SimTrainer>> workers;
    for (int r = 0; r < 2; ++r) {
      for (int w = 0; w < 3; ++w) {
        workers.push_back(std::make_unique<SimTrainer>(
            *service_, name, r, absl::StrCat("r", r, "w", w), nullptr, "", w,
            3));
      }
    }
    for (auto& t : workers) {
      ASSERT_EQ(t->begins.size(), 1u) << name;
      EXPECT_EQ(t->begins[0].samples_for_rank(), 21);
      EXPECT_EQ(t->begins[0].samples_for_worker(), 7);
    }
    // Worker 0 of rank 0 reads its whole slot first, before anyone else.
    EXPECT_EQ(workers[0]->Consume(100), 7) << name;
    workers[0]->Poll();
    EXPECT_EQ(workers[0]->waiting, v1::WAITING_QUOTA_REACHED) << name;
    EXPECT_TRUE(workers[0]->held.empty());
    std::vector<std::vector<std::tuple<int64_t, int32_t, int64_t>>> parts;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (i > 0) {
        EXPECT_EQ(workers[i]->Consume(100), 7) << name << " worker " << i;
      }
      parts.push_back(workers[i]->consumed);
    }
    auto seen = Tally(parts);
    EXPECT_EQ(seen.size(), 42u) << name;
    for (const auto& [s, n] : seen) EXPECT_EQ(n, 1) << name;
    auto job = service_->GetJob(name, false);
    ASSERT_OK(job);
    EXPECT_EQ(job->status().state(), v1::JOB_STATE_DONE) << name;
  }
}

// The number of workers can change only while no lease is out; a session
// saying another number meanwhile is refused, naming both.
TEST_F(CoordinatorServiceTest,
       AnotherNumberOfWorkersWhileLeasesAreOutIsRefused) {
  ASSERT_OK(service_->CreateJob(Spec("j", {10, 10}, 1, 1)));
  SimTrainer first(*service_, "j", 0, "a", nullptr, "", 0, 2);
  ASSERT_FALSE(first.held.empty());
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = service_->OpenSession(sink);
  v1::TrainerMessage hello = Hello("j", 0, "b");
  hello.mutable_hello()->set_num_workers(4);
  service_->OnMessage(id, hello);
  service_->Flush();
  ASSERT_TRUE(sink->finished.has_value());
  EXPECT_THAT(*sink->finished,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("read with 2 reader(s) per rank")));
  // A worker index out of range is INVALID_ARGUMENT naming the field.
  auto bad = std::make_shared<RecordingSink>();
  const int64_t bad_id = service_->OpenSession(bad);
  hello.mutable_hello()->set_num_workers(2);
  hello.mutable_hello()->set_worker(2);
  service_->OnMessage(bad_id, hello);
  service_->Flush();
  ASSERT_TRUE(bad->finished.has_value());
  EXPECT_THAT(*bad->finished, StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("hello.worker")));
}

}  // namespace
}  // namespace sluice
