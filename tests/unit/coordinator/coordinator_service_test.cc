#include "server/coordinator/coordinator_service.h"

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
#include "tests/testing/fake_clock.h"
#include "tests/testing/gated_journal.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::FakeClock;
using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

// Records what the service sends to one session.
class RecordingSink : public SessionSink {
 public:
  void Send(v1::CoordinatorMessage m) override {
    inbox.push_back(std::move(m));
  }
  void Finish(const absl::Status& s) override { finished = s; }
  // Pops every Grant received so far.
  std::vector<v1::Lease> TakeGrants() {
    std::vector<v1::Lease> grants;
    std::vector<v1::CoordinatorMessage> rest;
    for (auto& m : inbox) {
      if (m.has_grant())
        grants.push_back(m.grant().lease());
      else
        rest.push_back(m);
    }
    inbox = rest;
    return grants;
  }
  int Count(v1::CoordinatorMessage::MsgCase c) const {
    int n = 0;
    for (const auto& m : inbox) n += m.msg_case() == c;
    return n;
  }
  std::vector<v1::CoordinatorMessage> inbox;
  std::optional<absl::Status> finished;
};

v1::JobSpec Spec(const std::string& name, std::vector<int64_t> sizes,
                 int32_t world_size, int64_t epochs) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_manifest();
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto* s = spec.mutable_manifest()->add_shards();
    s->set_url("/data/shard-" + std::to_string(i) + ".tar");
    s->set_num_samples(sizes[i]);
  }
  spec.set_world_size(world_size);
  spec.set_num_epochs(epochs);
  spec.set_shuffle(true);
  spec.set_shuffle_window(1);  // units of one shard; windows tested apart
  spec.set_seed(5);
  spec.set_lease_ttl_ms(2000);
  return spec;
}

v1::TrainerMessage Hello(const std::string& job, int rank,
                         const std::string& trainer) {
  v1::TrainerMessage m;
  m.mutable_hello()->set_job(job);
  m.mutable_hello()->set_rank(rank);
  m.mutable_hello()->set_trainer_id(trainer);
  return m;
}
v1::TrainerMessage Want(int n) {
  v1::TrainerMessage m;
  m.mutable_want()->set_credits(n);
  return m;
}
// Opens trainer "t"'s session of rank 0 of job "j" (its messages arrive in
// `sink`), asks for one lease and returns the session's id.
int64_t OpenAndWantOne(CoordinatorService& service,
                       const std::shared_ptr<RecordingSink>& sink) {
  const int64_t id = service.OpenSession(sink);
  service.OnMessage(id, Hello("j", 0, "t"));
  service.OnMessage(id, Want(1));
  return id;
}
v1::TrainerMessage Complete(const v1::Lease& l) {
  v1::TrainerMessage m;
  m.mutable_complete()->set_lease_id(l.lease_id());
  m.mutable_complete()->set_fence(l.fence());
  return m;
}
v1::TrainerMessage Progress(const v1::Lease& l, int64_t consumed) {
  v1::TrainerMessage m;
  m.mutable_progress()->set_lease_id(l.lease_id());
  m.mutable_progress()->set_fence(l.fence());
  m.mutable_progress()->set_consumed(consumed);
  return m;
}

// A service on a fake clock with a journal in `dir`, for restart tests.
CoordinatorOptions JournaledOptions(FakeClock* clock, const std::string& dir) {
  CoordinatorOptions options;
  options.clock = clock;
  options.wait_for_data_servers = false;  // scripted trainers read nothing
  options.journal_dir = dir;
  return options;
}

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.clock = &clock_;
    options.wait_for_data_servers = false;  // scripted trainers read nothing
    auto service = CoordinatorService::Create(options);
    ASSERT_OK(service);
    service_ = std::move(*service);
  }
  FakeClock clock_;
  std::unique_ptr<CoordinatorService> service_;
};

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
          ++seen[lease.epoch()][{lease.unit().shard_index(), k}];
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
            lease.epoch(), lease.unit().shard_index(), lease.unit().begin(),
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

// A holder that stops heartbeating loses its lease at the TTL, and only the
// unconsumed remainder (after its last Progress) is granted again (G2, G4).
// The expiry thread belongs to the service and reads its clock: a lease
// expires when the injected clock passes its TTL (not the wall clock), and
// a Barrier's deadline is the same clock's.
TEST_F(CoordinatorServiceTest, TheExpiryThreadRunsOnTheServicesClock) {
  v1::JobSpec spec = Spec("j", {10}, 0, 1);  // lease TTL 2 s
  ASSERT_OK(service_->CreateJob(spec));
  auto a = std::make_shared<RecordingSink>();
  const int64_t ida = service_->OpenSession(a);
  service_->OnMessage(ida, Hello("j", 0, "dead"));
  service_->OnMessage(ida, Want(1));
  ASSERT_EQ(a->TakeGrants().size(), 1u);
  service_->CloseSession(ida);
  std::atomic<bool> barrier_done{false};
  absl::Status barrier_status;
  v1::BarrierRequest request;
  request.set_scope("s");
  request.set_name("b");
  request.set_participant("p0");
  request.set_participants(2);
  request.set_timeout_ms(5000);
  service_->once_barrier().Barrier(request,
                                   [&](absl::StatusOr<v1::BarrierResponse> r) {
                                     barrier_status = r.status();
                                     barrier_done = true;
                                   });
  service_->StartExpiryThread();
  auto expired = [&] {
    return service_->GetJob("j", false)->status().leases().expired();
  };
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(testing::WaitUntil([&] { return expired() == 1; },
                                 absl::Seconds(30), absl::Milliseconds(5)));
  EXPECT_FALSE(barrier_done);
  clock_.Advance(absl::Seconds(3) + absl::Milliseconds(1));
  ASSERT_TRUE(testing::WaitUntil([&] { return barrier_done.load(); },
                                 absl::Seconds(30), absl::Milliseconds(5)));
  EXPECT_EQ(barrier_status.code(), absl::StatusCode::kDeadlineExceeded)
      << barrier_status;
  service_->Drain();  // stops the thread
}

TEST_F(CoordinatorServiceTest, ExpiredLeaseRequeuesOnlyTheRemainder) {
  v1::JobSpec spec = Spec("j", {10}, 0, 1);
  spec.set_shuffle(false);
  ASSERT_OK(service_->CreateJob(spec));
  auto a = std::make_shared<RecordingSink>();
  const int64_t ida = service_->OpenSession(a);
  service_->OnMessage(ida, Hello("j", 0, "dead"));
  service_->OnMessage(ida, Want(1));
  std::vector<v1::Lease> grants = a->TakeGrants();
  ASSERT_EQ(grants.size(), 1u);
  service_->OnMessage(ida, Progress(grants[0], 4));
  service_->CloseSession(ida);  // stream cut, no goodbye

  auto b = std::make_shared<RecordingSink>();
  const int64_t idb = service_->OpenSession(b);
  service_->OnMessage(idb, Hello("j", 0, "alive"));
  service_->OnMessage(idb, Want(1));
  EXPECT_TRUE(b->TakeGrants().empty());
  clock_.Advance(absl::Milliseconds(1999));
  EXPECT_EQ(service_->ExpireLeases(), 0);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(service_->ExpireLeases(), 1);
  std::vector<v1::Lease> regrant = b->TakeGrants();
  ASSERT_EQ(regrant.size(), 1u);
  EXPECT_EQ(regrant[0].unit().begin(), 4);
  EXPECT_EQ(regrant[0].unit().end(), 10);
  EXPECT_GT(regrant[0].fence(), grants[0].fence());
  // The dead holder's late Complete carries a stale lease: rejected, ABORTED
  // or NOT_FOUND, never counted.
  auto late = std::make_shared<RecordingSink>();
  const int64_t idl = service_->OpenSession(late);
  service_->OnMessage(idl, Hello("j", 0, "dead"));
  service_->OnMessage(idl, Complete(grants[0]));
  ASSERT_EQ(late->Count(v1::CoordinatorMessage::kRejected), 1);
  service_->OnMessage(idb, Complete(regrant[0]));
  auto job = service_->GetJob("j", false);
  EXPECT_EQ(job->status().state(), v1::JOB_STATE_DONE);
  // The job's lease outcomes: two granted, the dead holder's expired, the
  // regrant completed; the late Complete counted nowhere.
  const v1::LeaseCounts& leases = job->status().leases();
  EXPECT_EQ(leases.granted(), 2);
  EXPECT_EQ(leases.expired(), 1);
  EXPECT_EQ(leases.completed(), 1);
  EXPECT_EQ(leases.returned(), 0);
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

// GetJob and ListJobs report state a crash cannot undo: an acknowledged
// Complete shows in them only once its journal record is durable, and a
// failed journal makes them UNAVAILABLE instead of reporting it.
TEST(CoordinatorDurabilityTest, JobReportsWaitForTheRecordsTheyInclude) {
  FakeClock clock;
  testing::GatedJournal* journal = nullptr;
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  options.journal_for_testing = [&journal] {
    auto j = std::make_unique<testing::GatedJournal>();
    journal = j.get();
    return j;
  };
  auto created = CoordinatorService::Create(options);
  ASSERT_OK(created);
  std::unique_ptr<CoordinatorService> service = std::move(*created);
  journal->MakeDurable(1);  // the job's creation
  ASSERT_OK(service->CreateJob(Spec("j", {10}, 0, 1)));
  auto a = std::make_shared<RecordingSink>();
  const int64_t id = service->OpenSession(a);
  service->OnMessage(id, Hello("j", 0, "t"));
  service->OnMessage(id, Want(1));
  journal->MakeDurable(journal->LastTicket());  // the grant
  service->Flush();
  const std::vector<v1::Lease> grants = a->TakeGrants();
  ASSERT_EQ(grants.size(), 1u);
  const int waits = journal->waits();
  service->OnMessage(id, Progress(grants[0], 4));  // journaled, not durable
  journal->AwaitWaits(waits + 1);                  // the outbox's flusher

  absl::StatusOr<v1::Job> reported;
  absl::Notification answered;
  std::thread reader([&] {
    reported = service->GetJob("j", false);
    answered.Notify();
  });
  // GetJob waits for the Progress record (or, wrongly, answers at once).
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        return journal->waits() >= waits + 2 || answered.HasBeenNotified();
      },
      absl::Seconds(60), absl::Milliseconds(1)));
  EXPECT_FALSE(answered.HasBeenNotified());
  journal->MakeDurable(journal->LastTicket());
  reader.join();
  ASSERT_OK(reported);
  EXPECT_EQ(reported->status().consumed_in_epoch(), 4);

  service->OnMessage(id, Progress(grants[0], 6));
  journal->Fail(absl::DataLossError("disk gone"));
  EXPECT_THAT(service->GetJob("j", false).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk gone")));
  EXPECT_THAT(service->ListJobs().status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk gone")));
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
  progress.mutable_progress()->set_lease_id(std::string(10 << 20, 'l'));
  progress.mutable_progress()->set_consumed(1);
  service_->OnMessage(id, progress);
  service_->Flush();
  ASSERT_EQ(c->Count(v1::CoordinatorMessage::kRejected), 1);
  for (const auto& m : c->inbox) {
    if (!m.has_rejected()) continue;
    EXPECT_EQ(m.rejected().code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_TRUE(m.rejected().lease_id().empty());
    EXPECT_LT(m.ByteSizeLong(), 300u);
  }
  EXPECT_FALSE(c->finished.has_value());
}

// The planning limits are the operator's (flags): lowered, they apply.
TEST(CoordinatorLimitsTest, JobLimitsComeFromTheOptions) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.job_limits.max_world_size = 2;
  options.job_limits.max_units_per_epoch = 5;
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  EXPECT_THAT(
      (*service)->CreateJob(Spec("w", {10}, 3, 1)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("3 is above the limit of 2 (--max_world_size)")));
  v1::JobSpec units = Spec("u", {10}, 1, 1);
  units.set_max_samples_per_lease(1);
  EXPECT_THAT((*service)->CreateJob(units),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more than 5 units (--max_units_per_epoch)")));
  units.set_max_samples_per_lease(5);
  EXPECT_OK((*service)->CreateJob(units));
}

TEST(CoordinatorLimitsTest, SessionsPerJobAreCapped) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  options.max_sessions_per_job = 2;
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  ASSERT_OK((*service)->CreateJob(Spec("j", {10}, 1, 1)));
  ASSERT_OK((*service)->CreateJob(Spec("k", {10}, 1, 1)));
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const char* job : {"j", "j", "j", "k"}) {
    sinks.push_back(std::make_shared<RecordingSink>());
    (*service)->OnMessage((*service)->OpenSession(sinks.back()),
                          Hello(job, 0, absl::StrCat("t", sinks.size())));
  }
  EXPECT_FALSE(sinks[0]->finished.has_value());
  EXPECT_FALSE(sinks[1]->finished.has_value());
  ASSERT_TRUE(sinks[2]->finished.has_value());
  EXPECT_THAT(*sinks[2]->finished,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("job j has 2 open sessions")));
  EXPECT_FALSE(sinks[3]->finished.has_value());  // another job's count
}

// With a lease secret, only a data server holding it can register (anyone
// else could register an address and have leases routed there); capacity
// and address are bounded either way.
TEST(CoordinatorLimitsTest, RegistrationNeedsTheLeaseSecretsCredential) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.lease_secret = "s3cret";
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  v1::RegisterDataServer r;
  r.set_address("10.0.0.7:7071");
  r.set_capacity(1);
  EXPECT_THAT((*service)->CheckRegistration(r),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("carries no credential")));
  r.set_credential(SignRegistration(r.address(), "other"));
  EXPECT_THAT((*service)->CheckRegistration(r),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("does not match")));
  r.set_credential(
      SignRegistration("10.0.0.8:7071", "s3cret"));  // another address's
  EXPECT_THAT((*service)->CheckRegistration(r),
              StatusIs(absl::StatusCode::kUnauthenticated));
  r.set_credential(SignRegistration(r.address(), "s3cret"));
  EXPECT_OK((*service)->CheckRegistration(r));
  r.set_capacity(2147483647);
  EXPECT_THAT((*service)->CheckRegistration(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("register.capacity")));
  r.set_capacity(1);
  r.set_address(std::string(1 << 20, 'a') + ":1");
  r.set_credential(SignRegistration(r.address(), "s3cret"));
  auto long_address = (*service)->CheckRegistration(r);
  EXPECT_THAT(long_address, StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("register.address")));
  EXPECT_LT(long_address.message().size(), 300u);
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

// A coordinator that starts leading over live leases (a restart, an HA
// takeover) keeps each one for its TTL and the reconnect grace: the holder
// may notice only now that its coordinator is gone. A holder that never
// comes back loses the lease after exactly that.
TEST(CoordinatorRecoveryTest,
     ARecoveredLeaseWaitsTheReconnectGraceForItsHolder) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock, dir.path());
  options.wait_for_data_servers = false;
  v1::JobSpec spec = Spec("j", {5, 5}, 1, 1);
  spec.set_lease_ttl_ms(2000);
  {
    auto service = CoordinatorService::Create(options);
    ASSERT_OK(service);
    ASSERT_OK((*service)->CreateJob(spec));
    auto sink = std::make_shared<RecordingSink>();
    OpenAndWantOne(**service, sink);
    (*service)->Flush();
    ASSERT_EQ(sink->TakeGrants().size(), 1u);
  }
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  clock.Advance(absl::Seconds(2) + kReconnectGrace - absl::Milliseconds(1));
  EXPECT_EQ((*service)->ExpireLeases(), 0);
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ((*service)->ExpireLeases(), 1);
}

// Replaying the journal yields the live state: same status, same leases.
TEST(CoordinatorRecoveryTest, ReplayEqualsLiveState) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock, dir.path());
  v1::Job before;
  std::string held_lease;
  {
    auto service = CoordinatorService::Create(options);
    ASSERT_OK(service);
    v1::JobSpec spec = Spec("j", {5, 5, 5}, 3, 2);
    spec.set_max_samples_per_lease(2);
    ASSERT_OK((*service)->CreateJob(spec));
    auto sink = std::make_shared<RecordingSink>();
    const int64_t id = (*service)->OpenSession(sink);
    (*service)->OnMessage(id, Hello("j", 1, "t1"));
    (*service)->OnMessage(id, Want(2));
    (*service)->Flush();
    std::vector<v1::Lease> grants = sink->TakeGrants();
    ASSERT_EQ(grants.size(), 2u);
    (*service)->OnMessage(id, Complete(grants[0]));
    (*service)->OnMessage(id, Progress(grants[1], 1));
    (*service)->Flush();
    held_lease = grants[1].lease_id();
    before = *(*service)->GetJob("j", false);
    // Sessions and lease counts are not durable state.
    before.mutable_status()->mutable_ranks(1)->clear_sessions();
    before.mutable_status()->clear_leases();
  }
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  EXPECT_GT((*service)->recovered_records(), 0);
  v1::Job after = *(*service)->GetJob("j", false);
  EXPECT_EQ(after.status().leases().granted(), 0);  // counted from start-up
  after.mutable_status()->clear_leases();
  EXPECT_EQ(after.status().DebugString(), before.status().DebugString());
  // The recovered lease has a fresh TTL and is handed back to its holder.
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = (*service)->OpenSession(sink);
  (*service)->OnMessage(id, Hello("j", 1, "t1"));
  (*service)->Flush();
  // Both leases it held (the progressed one and the one granted for the
  // credit its Complete freed) come back, each with a fresh TTL.
  std::vector<v1::Lease> again = sink->TakeGrants();
  ASSERT_EQ(again.size(), 2u);
  EXPECT_TRUE(again[0].lease_id() == held_lease ||
              again[1].lease_id() == held_lease);
  for (const v1::Lease& l : again) {
    EXPECT_EQ(l.expires_at_unix_ms(), absl::ToUnixMillis(clock.Now()) + 2000);
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// shard url -> data server, for every unit of a fresh job over `shards`.
std::map<std::string, std::string> Routes(CoordinatorService& service,
                                          const std::string& name, int shards) {
  std::vector<int64_t> sizes(static_cast<size_t>(shards), 1);
  v1::JobSpec spec = Spec(name, sizes, 0, 1);
  EXPECT_OK(service.CreateJob(spec));
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = service.OpenSession(sink);
  service.OnMessage(id, Hello(name, 0, "t-" + name));
  service.OnMessage(id, Want(shards));
  std::map<std::string, std::string> routes;
  for (const v1::Lease& l : sink->TakeGrants())
    routes[l.unit().shard_url()] = l.data_server();
  service.CloseSession(id);
  return routes;
}

TEST_F(CoordinatorServiceTest, GrantsNameDataServersByRendezvousHashing) {
  EXPECT_EQ(Routes(*service_, "none", 4).begin()->second,
            "");  // nobody registered
  const int64_t a = service_->RegisterDataServer("a:1", 1);
  const int64_t b = service_->RegisterDataServer("b:1", 1);
  const int64_t c = service_->RegisterDataServer("c:1", 1);
  std::map<std::string, std::string> before = Routes(*service_, "r1", 300);
  ASSERT_EQ(before.size(), 300u);
  std::map<std::string, int> load;
  for (const auto& [url, server] : before) ++load[server];
  ASSERT_EQ(load.size(), 3u);
  for (const auto& [server, n] : load) EXPECT_GT(n, 60) << server;  // ~100 each
  // Same servers, same routes.
  EXPECT_EQ(Routes(*service_, "r2", 300), before);
  // Removing b moves exactly b's shards; a's and c's stay put.
  service_->UnregisterDataServer(b);
  std::map<std::string, std::string> after = Routes(*service_, "r3", 300);
  for (const auto& [url, server] : before) {
    if (server == "b:1") {
      EXPECT_NE(after[url], "b:1");
    } else {
      EXPECT_EQ(after[url], server) << url;
    }
  }
  // Servers that stop heartbeating stop being chosen.
  clock_.Advance(absl::Seconds(2));
  service_->DataServerHeartbeat(a);
  clock_.Advance(absl::Seconds(2));  // c last seen 4 s ago > 3 x 1 s
  EXPECT_THAT(service_->LiveDataServers(), ::testing::ElementsAre("a:1"));
  for (const auto& [url, server] : Routes(*service_, "r4", 20))
    EXPECT_EQ(server, "a:1");
  (void)c;
}

// With shuffle windows, a grant names the window's shards (in the plan's
// order) and its interleave seed; the unit counts window positions, and
// the units of a window of local shards spread over the data servers
// (reader_routing_test.cc).
TEST_F(CoordinatorServiceTest, WindowGrantsCarryTheWindowsShards) {
  service_->RegisterDataServer("a:1", 1);
  service_->RegisterDataServer("b:1", 1);
  std::vector<int64_t> sizes;
  for (int i = 0; i < 10; ++i) sizes.push_back(10 + i);
  v1::JobSpec spec = Spec("win", sizes, 0, 1);
  spec.set_shuffle_window(4);
  spec.set_max_samples_per_lease(7);
  ASSERT_OK(service_->CreateJob(spec));
  PlanOptions options;
  options.seed = 5;
  options.shuffle = true;
  options.shuffle_window = 4;
  const std::vector<ShuffleWindow> windows = PlanWindows(sizes, options, 0);
  ASSERT_EQ(windows.size(), 2u);  // 10 shards, at least 4 per window
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = service_->OpenSession(sink);
  service_->OnMessage(id, Hello("win", 0, "t"));
  service_->OnMessage(id, Want(100));
  std::vector<v1::Lease> grants = sink->TakeGrants();
  std::map<int32_t, int64_t> covered;
  std::map<int32_t, std::set<std::string>> servers;
  for (const v1::Lease& l : grants) {
    const v1::WorkUnit& u = l.unit();
    ASSERT_LT(u.shard_index(), 2);
    const ShuffleWindow& w = windows[static_cast<size_t>(u.shard_index())];
    EXPECT_EQ(u.shard_url(), "");
    EXPECT_EQ(u.window_order(), w.order_seed);
    ASSERT_EQ(u.pieces_size(), static_cast<int>(w.shards.size()));
    for (int k = 0; k < u.pieces_size(); ++k) {
      EXPECT_EQ(u.pieces(k).shard_index(), w.shards[k]);
      EXPECT_EQ(u.pieces(k).url(),
                "/data/shard-" + std::to_string(w.shards[k]) + ".tar");
      EXPECT_EQ(u.pieces(k).num_samples(), sizes[w.shards[k]]);
    }
    EXPECT_LE(u.end() - u.begin(), 7);
    EXPECT_LE(u.end(), w.samples);
    covered[u.shard_index()] += u.end() - u.begin();
    servers[u.shard_index()].insert(l.data_server());
  }
  EXPECT_EQ(covered[0], windows[0].samples);
  EXPECT_EQ(covered[1], windows[1].samples);
  EXPECT_EQ(servers[0].size(), 2u);
  EXPECT_EQ(servers[1].size(), 2u);
  service_->CloseSession(id);
}

// A shuffled job without a window gets the default; a window out of range
// is refused naming the field.
TEST_F(CoordinatorServiceTest, ShuffleWindowDefaultsAndLimits) {
  v1::JobSpec spec = Spec("dflt", {3, 3}, 0, 1);
  spec.set_shuffle_window(0);
  auto job = service_->CreateJob(spec);
  ASSERT_OK(job);
  EXPECT_EQ(job->spec().shuffle_window(), 32);
  spec.set_name("neg");
  spec.set_shuffle_window(-1);
  EXPECT_THAT(service_->CreateJob(spec).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.shuffle_window")));
  spec.set_shuffle_window(1025);
  EXPECT_THAT(service_->CreateJob(spec).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.shuffle_window")));
}

// A service with lease secret "k" on the fixture's clock, one data server,
// and a session of job "t" holding one lease.
struct SignedSession {
  explicit SignedSession(FakeClock* clock)
      : sink(std::make_shared<RecordingSink>()) {
    CoordinatorOptions options;
    options.clock = clock;
    options.lease_secret = "k";
    auto created = CoordinatorService::Create(options);
    EXPECT_OK(created);
    service = std::move(*created);
    service->RegisterDataServer("a:1", 1);
    EXPECT_OK(service->CreateJob(Spec("t", {5}, 1, 1)));
    id = service->OpenSession(sink);
    service->OnMessage(id, Hello("t", 0, "x"));
    service->OnMessage(id, Want(1));
  }
  std::unique_ptr<CoordinatorService> service;
  std::shared_ptr<RecordingSink> sink;
  int64_t id = 0;
};

TEST_F(CoordinatorServiceTest, LeaseTokensSignTheGrantedLease) {
  SignedSession t(&clock_);
  std::vector<v1::Lease> grants = t.sink->TakeGrants();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_OK(VerifyLeaseToken(grants[0], "k"));
  EXPECT_THAT(VerifyLeaseToken(grants[0], "other"),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

// A token signs the lease's expiry; while its holder heartbeats, the lease
// is sent again (same id and fence) with the renewed expiry and a new token
// once less than half the TTL (2 s here) is left on the one it has, and not
// more often.
TEST_F(CoordinatorServiceTest, HeldLeasesGetFreshTokensBeforeTheirsExpire) {
  SignedSession t(&clock_);
  std::vector<v1::Lease> first = t.sink->TakeGrants();
  ASSERT_EQ(first.size(), 1u);
  v1::TrainerMessage beat;
  beat.mutable_heartbeat();
  clock_.Advance(absl::Milliseconds(900));  // 1.1 s of 2 left
  t.service->OnMessage(t.id, beat);
  EXPECT_TRUE(t.sink->TakeGrants().empty());
  clock_.Advance(absl::Milliseconds(200));  // 0.9 s left on the token
  t.service->OnMessage(t.id, beat);
  std::vector<v1::Lease> again = t.sink->TakeGrants();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].lease_id(), first[0].lease_id());
  EXPECT_EQ(again[0].fence(), first[0].fence());
  EXPECT_EQ(again[0].expires_at_unix_ms(),
            first[0].expires_at_unix_ms() + 1100);
  EXPECT_NE(again[0].token(), first[0].token());
  EXPECT_OK(VerifyLeaseToken(again[0], "k"));
  t.service->OnMessage(t.id, beat);
  EXPECT_TRUE(t.sink->TakeGrants().empty());
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// A scripted trainer: takes grants in order and consumes them sample by
// sample, reporting each sample as it goes (acknowledgement order ==
// delivery order, as sluice::Reader does).
struct SimTrainer {
  SimTrainer(CoordinatorService& s, const std::string& job, int rank,
             const std::string& id, const v1::Cursor* cursor = nullptr,
             const std::string& attempt = "", int worker = 0,
             int num_workers = 0, const std::string& launch_id = "")
      : service(s), sink(std::make_shared<RecordingSink>()) {
    session = service.OpenSession(sink);
    v1::TrainerMessage hello = Hello(job, rank, id);
    hello.mutable_hello()->set_worker(worker);
    hello.mutable_hello()->set_num_workers(num_workers);
    hello.mutable_hello()->set_launch_id(launch_id);
    if (cursor != nullptr) {
      *hello.mutable_hello()->mutable_cursor() = *cursor;
      hello.mutable_hello()->set_resume_attempt(attempt);
    }
    Send(hello);
    Send(Want(2));
    Poll();
  }
  // Sends one message and waits until every reply was handed to the sink
  // (with a file journal, replies leave from the journal's flusher thread).
  void Send(const v1::TrainerMessage& m) {
    service.OnMessage(session, m);
    service.Flush();
  }
  // Takes in what the coordinator sent.
  void Poll() {
    for (v1::Lease& l : sink->TakeGrants()) held.push_back(l);
    for (const auto& m : sink->inbox) {
      if (m.has_revoke()) revoked.insert(m.revoke().lease_id());
      if (m.has_waiting()) waiting = m.waiting().kind();
      if (m.has_epoch_begin()) begins.push_back(m.epoch_begin());
      if (m.has_job_done()) job_done = true;
    }
    sink->inbox.clear();
  }
  // Consumes up to n samples; returns how many it could.
  int64_t Consume(int64_t n) {
    int64_t done = 0;
    while (done < n) {
      Poll();
      while (!held.empty() && revoked.count(held.front().lease_id()) > 0)
        held.pop_front();
      if (held.empty()) break;
      v1::Lease& l = held.front();
      const int64_t k = l.unit().begin() + delivered[l.lease_id()]++;
      consumed.push_back({l.epoch(), l.unit().shard_index(), k});
      ++done;
      if (k + 1 == l.unit().end()) {
        v1::Lease finished = l;
        held.pop_front();
        Send(Complete(finished));
      } else {
        Send(Progress(l, delivered[l.lease_id()]));
      }
    }
    return done;
  }
  CoordinatorService& service;
  std::shared_ptr<RecordingSink> sink;
  int64_t session = 0;
  std::deque<v1::Lease> held;
  std::map<std::string, int64_t> delivered;
  std::set<std::string> revoked;
  std::vector<v1::EpochBegin> begins;
  bool job_done = false;
  v1::WaitingKind waiting = v1::WAITING_KIND_UNSPECIFIED;
  std::vector<std::tuple<int64_t, int32_t, int64_t>>
      consumed;  // epoch, shard, index
};

v1::Cursor MakeCursor(const std::string& job, int64_t epoch, int32_t world_size,
                      std::vector<int64_t> counts) {
  v1::Cursor c;
  c.set_job(job);
  c.set_epoch(epoch);
  c.set_world_size(world_size);
  for (int64_t n : counts) c.add_consumed_per_rank(n);
  return c;
}

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

// Every sample each epoch served to `trainers`, with how often it was seen.
std::map<std::tuple<int64_t, int32_t, int64_t>, int> Tally(
    const std::vector<std::vector<std::tuple<int64_t, int32_t, int64_t>>>&
        parts) {
  std::map<std::tuple<int64_t, int32_t, int64_t>, int> seen;
  for (const auto& part : parts) {
    for (const auto& s : part) ++seen[s];
  }
  return seen;
}

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
  CoordinatorOptions options = JournaledOptions(&clock, dir.path());
  const v1::Cursor cursor = MakeCursor("j", 0, 2, {4, 3});
  {
    auto created = CoordinatorService::Create(options);
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
  auto reopened = CoordinatorService::Create(options);
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

// The coordinator stopped for 8 s (SIGSTOP) with a 2 s TTL: its holders'
// heartbeats could not be read, so the first tick after the stall gives
// every lease and data server a fresh TTL instead of expiring them; a lease
// whose holder then stays silent expires one TTL and kReconnectGrace later.
TEST(CoordinatorStallTest, AStalledCoordinatorExpiresNothingForTheStall) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.stall_clock = &clock;
  options.wait_for_data_servers = false;
  auto created = CoordinatorService::Create(options);
  ASSERT_OK(created);
  CoordinatorService& service = **created;
  v1::JobSpec spec = Spec("j", {10, 10}, 1, 1);
  spec.set_lease_ttl_ms(2000);
  ASSERT_OK(service.CreateJob(spec));
  const int64_t server = service.RegisterDataServer("ds:1", 1);
  auto sink = std::make_shared<RecordingSink>();
  OpenAndWantOne(service, sink);
  ASSERT_EQ(sink->TakeGrants().size(), 1u);
  EXPECT_EQ(service.ExpiryTick(), 0);
  for (int i = 0; i < 10; ++i) {  // running: ticks every 100 ms
    clock.Advance(absl::Milliseconds(100));
    EXPECT_EQ(service.ExpiryTick(), 0);
  }
  clock.Advance(absl::Seconds(8));  // stopped
  EXPECT_EQ(service.ExpiryTick(), 0);
  auto job = service.GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().leases().expired(), 0);
  EXPECT_EQ(service.LiveDataServers().size(), 1u);
  // Running again, and the holder silent: the lease lives one fresh TTL
  // and the grace its holder has to reconnect.
  const int ticks = static_cast<int>((absl::Seconds(2) + kReconnectGrace) /
                                     absl::Milliseconds(100));
  for (int i = 0; i < ticks - 1; ++i) {
    clock.Advance(absl::Milliseconds(100));
    EXPECT_EQ(service.ExpiryTick(), 0) << i;
  }
  clock.Advance(absl::Milliseconds(100));
  EXPECT_EQ(service.ExpiryTick(), 1);
  service.UnregisterDataServer(server);
}

// A fake clock that, armed for one thread, stops that thread in Now() until
// released: a stand-in for a long operation under the coordinator's lock
// (CommitLocked reads the clock under it).
class GateClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    if (armed_ && std::this_thread::get_id() == thread_) {
      armed_ = false;
      entered_ = true;
      mu_.Await(absl::Condition(&released_));
    }
    return now_;
  }
  void ArmForThisThread() {
    absl::MutexLock lock(&mu_);
    thread_ = std::this_thread::get_id();
    armed_ = true;
  }
  void WaitEntered() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&entered_));
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'700'000'000);
  std::thread::id thread_ ABSL_GUARDED_BY(mu_);
  mutable bool armed_ ABSL_GUARDED_BY(mu_) = false;
  mutable bool entered_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// A data server's heartbeat is recorded while another call holds the
// coordinator's state lock: session work can never hold it back past the
// server's timeout.
TEST(CoordinatorDataServerTest, AHeartbeatDoesNotWaitForTheStateLock) {
  GateClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  auto created = CoordinatorService::Create(options);
  ASSERT_OK(created);
  CoordinatorService& service = **created;
  const absl::Duration timeout = service.data_server_timeout();
  const int64_t server = service.RegisterDataServer("ds:1", 1);
  clock.Advance(timeout - absl::Seconds(1));
  // CreateJob stops under the lock, in its journal record's time stamp.
  std::thread holder([&] {
    clock.ArmForThisThread();
    EXPECT_OK(service.CreateJob(Spec("j", {10}, 1, 1)));
  });
  clock.WaitEntered();
  absl::Notification beaten;
  std::thread beat([&] {
    service.DataServerHeartbeat(server);
    beaten.Notify();
  });
  // A deadlock detector, not a timing bound: with the lock needed, the
  // heartbeat returns only after the release below.
  EXPECT_TRUE(beaten.WaitForNotificationWithTimeout(absl::Seconds(60)));
  clock.Release();
  holder.join();
  beat.join();
  // Live a whole timeout after the first registration: the heartbeat counted.
  clock.Advance(absl::Seconds(2));
  EXPECT_THAT(service.LiveDataServers(), ::testing::ElementsAre("ds:1"));
}

// A service on a fake clock that grants without data servers.
class FakeClockServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options.clock = &clock;
    options.wait_for_data_servers = false;
    auto created = CoordinatorService::Create(options);
    ASSERT_OK(created);
    owned_ = std::move(*created);
  }
  // A Hello of `worker` of `workers` readers of `rank`.
  static v1::TrainerMessage WorkerHello(const std::string& job, int rank,
                                        int worker, int workers,
                                        const std::string& trainer) {
    v1::TrainerMessage hello = Hello(job, rank, trainer);
    hello.mutable_hello()->set_worker(worker);
    hello.mutable_hello()->set_num_workers(workers);
    return hello;
  }
  // Opens a session of `worker` of 2 readers of rank 0 of job "j", asks
  // for `credits` and returns the grants it gets.
  std::vector<v1::Lease> OpenWorker(int worker, const std::string& trainer,
                                    int credits,
                                    const std::shared_ptr<RecordingSink>& sink,
                                    int64_t* id) {
    *id = owned_->OpenSession(sink);
    owned_->OnMessage(*id, WorkerHello("j", 0, worker, 2, trainer));
    owned_->OnMessage(*id, Want(credits));
    owned_->Flush();
    return sink->TakeGrants();
  }
  FakeClock clock;
  CoordinatorOptions options;
  std::unique_ptr<CoordinatorService> owned_;
  CoordinatorService& service() { return *owned_; }
};
using CoordinatorScaleTest = FakeClockServiceTest;

// Two workers of rank 0 of a dynamic job (3 shards of 10, units of 5),
// each holding one unit; worker 0 (A) goes silent past its TTL while
// worker 1 (B) heartbeats, and A's lease expires.
class CoordinatorExpiryTest : public FakeClockServiceTest {
 protected:
  void ExpireWorkerA() {
    v1::JobSpec spec = Spec("j", {10, 10, 10}, 1, 1);
    spec.set_mode(v1::MODE_DYNAMIC);
    spec.set_max_samples_per_lease(5);
    ASSERT_OK(service().CreateJob(spec));
    b1 = OpenWorker(1, "w1", 1, b_sink, &b);
    a1 = OpenWorker(0, "w0", 1, a_sink, &a);
    ASSERT_EQ(b1.size(), 1u);
    ASSERT_EQ(a1.size(), 1u);
    service().OnMessage(a, Want(0));
    clock.Advance(absl::Milliseconds(1500));
    v1::TrainerMessage beat;
    beat.mutable_heartbeat();
    service().OnMessage(b, beat);
    clock.Advance(absl::Milliseconds(600));
    EXPECT_EQ(service().ExpireLeases(), 1);
  }
  // B completes its unit; its next one must not be A's remainder.
  void BTakesOtherWork() {
    service().OnMessage(b, Complete(b1[0]));
    service().Flush();
    const std::vector<v1::Lease> b2 = b_sink->TakeGrants();
    ASSERT_EQ(b2.size(), 1u);
    EXPECT_FALSE(b2[0].unit().sequence() == a1[0].unit().sequence() &&
                 b2[0].unit().begin() == a1[0].unit().begin())
        << b2[0].DebugString();
  }
  // `grants` is exactly A's expired unit again.
  void ExpectARemainder(const std::vector<v1::Lease>& grants) {
    ASSERT_EQ(grants.size(), 1u);
    EXPECT_EQ(grants[0].unit().sequence(), a1[0].unit().sequence());
    EXPECT_EQ(grants[0].unit().begin(), a1[0].unit().begin());
    EXPECT_EQ(grants[0].unit().end(), a1[0].unit().end());
  }
  std::shared_ptr<RecordingSink> a_sink = std::make_shared<RecordingSink>();
  std::shared_ptr<RecordingSink> b_sink = std::make_shared<RecordingSink>();
  int64_t a = 0, b = 0;
  std::vector<v1::Lease> a1, b1;
};

// A reader that lost a lease to expiry (paused past its TTL) may have
// delivered some of it unreported; only it can tell which, so the rest goes
// back to its own slot while its session is open. Another worker of the
// rank is given other work meanwhile.
TEST_F(CoordinatorExpiryTest, AnExpiredRemainderGoesBackToItsOwnSlot) {
  ASSERT_NO_FATAL_FAILURE(ExpireWorkerA());
  ASSERT_NO_FATAL_FAILURE(BTakesOtherWork());
  service().OnMessage(a, Want(1));
  service().Flush();
  ExpectARemainder(a_sink->TakeGrants());
}

// A paused reader's stream often breaks when it wakes, after its lease has
// expired: its slot keeps the remainder for kReconnectGrace, and the reader
// gets it back on its new session.
TEST_F(CoordinatorExpiryTest, AReconnectingReaderGetsItsRemainderBack) {
  ASSERT_NO_FATAL_FAILURE(ExpireWorkerA());
  service().CloseSession(a);
  ASSERT_NO_FATAL_FAILURE(BTakesOtherWork());
  ExpectARemainder(
      OpenWorker(0, "w0", 1, std::make_shared<RecordingSink>(), &a));
}

// With the slot's session gone for kReconnectGrace, anyone may take its
// remainder.
TEST_F(CoordinatorExpiryTest, AGoneSlotsRemainderGoesToAnyoneAfterTheGrace) {
  CoordinatorService& service = this->service();
  v1::JobSpec spec = Spec("j", {5, 5}, 0, 1);  // a pool: no quotas
  spec.set_mode(v1::MODE_DYNAMIC);
  ASSERT_OK(service.CreateJob(spec));
  int64_t a = 0, b = 0;
  const std::vector<v1::Lease> a1 =
      OpenWorker(0, "a", 1, std::make_shared<RecordingSink>(), &a);
  ASSERT_EQ(a1.size(), 1u);
  service.OnMessage(a, Want(0));
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(service.ExpireLeases(), 1);
  service.CloseSession(a);
  clock.Advance(kReconnectGrace);
  const std::vector<v1::Lease> b1 =
      OpenWorker(1, "b", 1, std::make_shared<RecordingSink>(), &b);
  ASSERT_EQ(b1.size(), 1u);
  EXPECT_EQ(b1[0].unit().sequence(), a1[0].unit().sequence());
  EXPECT_EQ(b1[0].unit().begin(), a1[0].unit().begin());
}

// A released unit goes to another session already waiting for work (here a
// second trainer of the same reader slot), not only to the releasing one.
TEST_F(CoordinatorExpiryTest, AReleasedUnitFeedsAWaitingSession) {
  CoordinatorService& service = this->service();
  v1::JobSpec spec = Spec("j", {5}, 0, 1);
  spec.set_mode(v1::MODE_DYNAMIC);
  ASSERT_OK(service.CreateJob(spec));
  auto a_sink = std::make_shared<RecordingSink>();
  auto b_sink = std::make_shared<RecordingSink>();
  const int64_t a = service.OpenSession(a_sink);
  service.OnMessage(a, Hello("j", 0, "a"));
  service.OnMessage(a, Want(1));
  const int64_t b = service.OpenSession(b_sink);
  service.OnMessage(b, Hello("j", 0, "b"));
  service.OnMessage(b, Want(1));
  service.Flush();
  const std::vector<v1::Lease> a1 = a_sink->TakeGrants();
  ASSERT_EQ(a1.size(), 1u);
  ASSERT_TRUE(b_sink->TakeGrants().empty());  // the job's only unit is A's
  service.OnMessage(a, Want(0));
  v1::TrainerMessage release;
  release.mutable_release()->set_lease_id(a1[0].lease_id());
  release.mutable_release()->set_fence(a1[0].fence());
  service.OnMessage(a, release);
  service.Flush();
  const std::vector<v1::Lease> b1 = b_sink->TakeGrants();
  ASSERT_EQ(b1.size(), 1u);
  EXPECT_EQ(b1[0].unit().sequence(), a1[0].unit().sequence());
  EXPECT_EQ(b1[0].unit().begin(), a1[0].unit().begin());
  EXPECT_EQ(b1[0].unit().end(), a1[0].unit().end());
}

// A reader whose lease expired holds fewer leases than its credits: the
// tick that expired it grants it work again (its own remainder) at once,
// as any message of its own would.
TEST_F(CoordinatorExpiryTest, AnExpiredHolderIsFedByTheSameTick) {
  CoordinatorService& service = this->service();
  v1::JobSpec spec = Spec("j", {10}, 1, 1);
  spec.set_mode(v1::MODE_DYNAMIC);
  spec.set_max_samples_per_lease(5);
  ASSERT_OK(service.CreateJob(spec));
  int64_t a = 0;
  auto a_sink = std::make_shared<RecordingSink>();
  const std::vector<v1::Lease> a1 = OpenWorker(0, "a", 1, a_sink, &a);
  ASSERT_EQ(a1.size(), 1u);
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(service.ExpireLeases(), 1);
  service.Flush();
  const std::vector<v1::Lease> a2 = a_sink->TakeGrants();
  ASSERT_EQ(a2.size(), 1u);
  EXPECT_NE(a2[0].lease_id(), a1[0].lease_id());
  EXPECT_EQ(a2[0].unit().sequence(), a1[0].unit().sequence());
  EXPECT_EQ(a2[0].unit().begin(), a1[0].unit().begin());
}

// A job's readers are asked to heartbeat at most kHeartbeatsPerSecondPerJob
// times a second together: 1,024 ranks x 8 workers every 4 s (0.4 of the
// 10 s TTL the job sets caps it), a small job at --heartbeat_interval. Opening
// them sends each session exactly its own Welcome and EpochBegin.
TEST_F(CoordinatorScaleTest, ABigJobHeartbeatsWithinTheBudgetAndOpensOnce) {
  CoordinatorService& service = this->service();
  v1::JobSpec big = Spec("big", std::vector<int64_t>(64, 100), 1024, 1);
  big.set_lease_ttl_ms(10000);
  ASSERT_OK(service.CreateJob(big));
  ASSERT_OK(service.CreateJob(Spec("small", {10}, 1, 1)));
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int rank = 0; rank < 1024; ++rank) {
    for (int worker = 0; worker < 8; ++worker) {
      auto sink = std::make_shared<RecordingSink>();
      service.OnMessage(service.OpenSession(sink),
                        WorkerHello("big", rank, worker, 8,
                                    absl::StrCat("t", rank, "-", worker)));
      sinks.push_back(sink);
    }
  }
  auto small = std::make_shared<RecordingSink>();
  service.OnMessage(service.OpenSession(small), Hello("small", 0, "s"));
  service.Flush();
  for (const auto& sink : sinks) {
    ASSERT_EQ(sink->Count(v1::CoordinatorMessage::kWelcome), 1);
    ASSERT_EQ(sink->Count(v1::CoordinatorMessage::kEpochBegin), 1);
    EXPECT_EQ(sink->inbox[0].welcome().heartbeat_interval_ms(), 4000);
  }
  ASSERT_EQ(small->Count(v1::CoordinatorMessage::kWelcome), 1);
  EXPECT_EQ(small->inbox[0].welcome().heartbeat_interval_ms(),
            absl::ToInt64Milliseconds(options.heartbeat_interval));
}

// A job that sets no lease TTL and has too many readers for the default one
// gets a TTL long enough for its heartbeats to fit the budget: 2,048 ranks x
// 8 workers heartbeat every 8.192 s (2,000 a second together) with 20.48 s
// TTLs, and a silent reader's lease returns exactly when that TTL is up.
// 1,000 ranks x 8 workers keep the default 10 s (every 4 s, 2,000 a second).
TEST_F(CoordinatorScaleTest, ABigJobWithoutATtlGetsOneItsHeartbeatsFit) {
  CoordinatorService& service = this->service();
  ASSERT_EQ(options.default_lease_ttl, absl::Seconds(10));
  v1::JobSpec big = Spec("big", std::vector<int64_t>(64, 1000), 2048, 1);
  big.clear_lease_ttl_ms();
  ASSERT_OK(service.CreateJob(big));
  v1::JobSpec fits = Spec("fits", std::vector<int64_t>(64, 100), 1000, 1);
  fits.clear_lease_ttl_ms();
  ASSERT_OK(service.CreateJob(fits));
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = service.OpenSession(sink);
  service.OnMessage(id, WorkerHello("big", 7, 3, 8, "big-7-3"));
  service.OnMessage(id, Want(1));
  auto other = std::make_shared<RecordingSink>();
  service.OnMessage(service.OpenSession(other),
                    WorkerHello("fits", 0, 0, 8, "fits-0-0"));
  service.Flush();
  ASSERT_EQ(sink->Count(v1::CoordinatorMessage::kWelcome), 1);
  EXPECT_EQ(sink->inbox[0].welcome().heartbeat_interval_ms(), 8192);
  EXPECT_EQ(sink->inbox[0].welcome().lease_ttl_ms(), 20480);
  ASSERT_EQ(other->Count(v1::CoordinatorMessage::kWelcome), 1);
  EXPECT_EQ(other->inbox[0].welcome().heartbeat_interval_ms(), 4000);
  EXPECT_EQ(other->inbox[0].welcome().lease_ttl_ms(), 10000);
  const std::vector<v1::Lease> held = sink->TakeGrants();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].expires_at_unix_ms(),
            absl::ToUnixMillis(clock.Now() + absl::Milliseconds(20480)));
  clock.Advance(absl::Milliseconds(20479));
  EXPECT_EQ(service.ExpireLeases(), 0);
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(service.ExpireLeases(), 1);
}

// A job without a lease TTL of its own follows the coordinator's
// --default_lease_ttl, in the Welcome and in the leases it is granted.
TEST(CoordinatorDefaultTtlTest, AJobWithoutATtlUsesTheCoordinatorsDefault) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  options.default_lease_ttl = absl::Seconds(3);
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  v1::JobSpec spec = Spec("j", {10}, 1, 1);
  spec.clear_lease_ttl_ms();
  ASSERT_OK((*service)->CreateJob(spec));
  auto sink = std::make_shared<RecordingSink>();
  OpenAndWantOne(**service, sink);
  (*service)->Flush();
  ASSERT_EQ(sink->Count(v1::CoordinatorMessage::kWelcome), 1);
  EXPECT_EQ(sink->inbox[0].welcome().lease_ttl_ms(), 3000);
  const std::vector<v1::Lease> held = sink->TakeGrants();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].expires_at_unix_ms(),
            absl::ToUnixMillis(clock.Now() + absl::Seconds(3)));
  EXPECT_EQ((*service)->GetJob("j", false)->spec().lease_ttl_ms(), 0);
}

// Creating a job again with the same spec returns it. A TTL left unset
// matches a job journaled with 10,000 ms for it; another TTL is another spec.
TEST_F(CoordinatorServiceTest, RecreatingAJobWithoutItsTtlReturnsIt) {
  v1::JobSpec spec = Spec("j", {10}, 1, 1);
  spec.set_lease_ttl_ms(10000);
  ASSERT_OK(service_->CreateJob(spec));
  spec.clear_lease_ttl_ms();
  absl::StatusOr<v1::Job> again = service_->CreateJob(spec);
  ASSERT_OK(again);
  EXPECT_EQ(again->spec().lease_ttl_ms(), 10000);
  spec.set_lease_ttl_ms(3000);
  EXPECT_THAT(service_->CreateJob(spec),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("job j exists with a different spec")));
  v1::JobSpec unset = Spec("k", {10}, 1, 1);
  unset.clear_lease_ttl_ms();
  ASSERT_OK(service_->CreateJob(unset));
  EXPECT_OK(service_->CreateJob(unset));
  unset.set_lease_ttl_ms(10000);
  EXPECT_THAT(service_->CreateJob(unset),
              StatusIs(absl::StatusCode::kAlreadyExists));
}

// A data server claims to have seen fences near 2^64 (only a holder of the
// registration secret can): refused, naming the field. The largest claim
// accepted still leaves grants distinct, increasing fences.
TEST_F(CoordinatorServiceTest, FencesNeverWrapWhateverADataServerClaims) {
  v1::RegisterDataServer r;
  r.set_address("ds:1");
  r.set_max_fence_seen(~uint64_t{0} - 1);
  EXPECT_THAT(service_->CheckRegistration(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("register.max_fence_seen")));
  EXPECT_THAT(CoordinatorService::CheckFenceSeen("heartbeat.max_fence_seen",
                                                 ~uint64_t{0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("heartbeat.max_fence_seen")));
  r.set_max_fence_seen(uint64_t{1} << 62);
  EXPECT_OK(service_->CheckRegistration(r));
  service_->RegisterDataServer("ds:1", 1, nullptr, uint64_t{1} << 62);
  v1::JobSpec spec = Spec("j", {10}, 1, 1);
  spec.set_max_samples_per_lease(2);
  ASSERT_OK(service_->CreateJob(spec));
  SimTrainer t(*service_, "j", 0, "t");
  ASSERT_EQ(t.held.size(), 2u);
  EXPECT_EQ(t.held[0].fence(), (uint64_t{1} << 62) + 1);
  EXPECT_EQ(t.held[1].fence(), (uint64_t{1} << 62) + 2);
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
  CoordinatorOptions options = JournaledOptions(&clock, dir.path());
  v1::Job before;
  {
    auto created = CoordinatorService::Create(options);
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
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  v1::Job after = *(*service)->GetJob("three", false);
  for (int r = 0; r < 3; ++r)
    before.mutable_status()->mutable_ranks(r)->clear_sessions();
  before.mutable_status()->clear_leases();  // counted since start-up
  after.mutable_status()->clear_leases();
  EXPECT_EQ(after.status().DebugString(), before.status().DebugString());
}

// An elastic run: 4 ranks, then 3 (a node left: the job's copy for 3 ranks
// resumes from the 4-rank checkpoint), then 4 again (the job itself resumes
// from the copy's checkpoint). Every sample of the epoch is trained at most
// once, and only each re-plan's remainder (under world size) is left out.
TEST(CoordinatorResumeTest, AJobAndItsCopyResumeEachOtherBothWays) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock, dir.path());
  auto created = CoordinatorService::Create(options);
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

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

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

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// With a tiny compaction threshold the journal is replaced by snapshots
// again and again during three epochs, a resume and live leases; it stays
// small, starts with a Snapshot, and a restart rebuilds the same state
// (leases, counts, the kept previous epoch, the resume) as the live server.
TEST(CoordinatorCompactionTest, SnapshotsKeepTheJournalSmallAndReplayExactly) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock, dir.path());
  options.journal_compact_bytes = 4096;
  std::string before;
  std::set<std::string> held;
  {
    auto created = CoordinatorService::Create(options);
    ASSERT_OK(created);
    CoordinatorService& service = **created;
    v1::JobSpec spec = Spec("j", {40, 25, 35}, 2, 4);  // q = 50
    spec.set_max_samples_per_lease(7);
    ASSERT_OK(service.CreateJob(spec));
    SimTrainer a(service, "j", 0, "a"), b(service, "j", 1, "b");
    ASSERT_EQ(a.Consume(50), 50);
    ASSERT_EQ(b.Consume(50), 50);
    ASSERT_EQ(a.Consume(31), 31);  // epoch 1
    ASSERT_EQ(b.Consume(12), 12);
    // Resume into epoch 0, then consume into epoch 1 again.
    const v1::Cursor cursor = MakeCursor("j", 0, 2, {44, 9});
    SimTrainer a2(service, "j", 0, "a2", &cursor),
        b2(service, "j", 1, "b2", &cursor);
    ASSERT_EQ(b2.Consume(41), 41);
    ASSERT_EQ(a2.Consume(6 + 20), 26);
    ASSERT_EQ(b2.Consume(3), 3);
    for (const v1::Lease& l : a2.held) held.insert(l.lease_id());
    for (const v1::Lease& l : b2.held) held.insert(l.lease_id());
    v1::JobStatus status = service.GetJob("j", false)->status();
    status.clear_leases();  // counted since start-up, not journaled
    before = status.DebugString();
  }
  struct stat st;
  ASSERT_EQ(stat((dir.path() + "/journal.log").c_str(), &st), 0);
  EXPECT_LT(st.st_size, 3 * 4096);
  auto reopened = CoordinatorService::Create(options);
  ASSERT_OK(reopened);
  v1::Job after = *(*reopened)->GetJob("j", false);
  for (auto& r : *after.mutable_status()->mutable_ranks())
    r.set_sessions(1);  // as before
  after.mutable_status()->clear_leases();
  EXPECT_EQ(after.status().DebugString(), before);
  EXPECT_EQ(after.status().epoch(), 1);
  EXPECT_EQ(after.status().ranks(0).consumed(), 20);
  EXPECT_EQ(after.status().ranks(1).consumed(), 3);
  // The same cursor again with the same attempt is still a no-op, and the
  // previous epoch is still there for a new attempt.
  const v1::Cursor cursor = MakeCursor("j", 0, 2, {44, 9});
  SimTrainer again(**reopened, "j", 0, "a2", &cursor);
  EXPECT_FALSE(again.sink->finished.has_value());
  EXPECT_EQ((*reopened)->GetJob("j", false)->status().epoch(), 1);
  // Leases held at the restart come back to their holder.
  std::set<std::string> regranted;
  for (const v1::Lease& l : again.held) regranted.insert(l.lease_id());
  for (const std::string& id : regranted) EXPECT_EQ(held.count(id), 1u) << id;
  SimTrainer retry(**reopened, "j", 1, "b3", &cursor, "restart-2");
  EXPECT_FALSE(retry.sink->finished.has_value());
  EXPECT_EQ((*reopened)->GetJob("j", false)->status().epoch(), 0);
}

// A Journal over a MemoryJournal whose compactions wait in FinishCompaction
// until the test lets them go.
class HeldCompactionJournal final : public Journal {
 public:
  explicit HeldCompactionJournal(MemoryJournal* records) : records_(records) {}
  uint64_t Enqueue(const std::vector<JournalRecord>& r) override {
    return records_->Enqueue(r);
  }
  uint64_t Enqueue(const JournalRecord& r) override {
    return records_->Enqueue(r);
  }
  absl::Status WaitDurable(uint64_t t) override {
    return records_->WaitDurable(t);
  }
  uint64_t LastTicket() const override { return records_->LastTicket(); }
  bool IsDurable(uint64_t t) const override { return records_->IsDurable(t); }
  int64_t bytes_written() const override { return records_->bytes_written(); }
  void BeginCompaction() override {
    mark = records_->LastTicket();
    records_->BeginCompaction();
    begun.store(true);
  }
  absl::Status FinishCompaction(const JournalRecord& snapshot) override {
    started.Notify();
    release.WaitForNotification();
    return records_->FinishCompaction(snapshot);
  }
  std::atomic<bool> begun{false};
  absl::Notification started, release;
  uint64_t mark = 0;  // records before the compaction's snapshot

 private:
  MemoryJournal* const records_;
};

// The state the records give when replayed from the start.
std::string Replayed(const std::vector<JournalRecord>& records) {
  CoordinatorState state;
  for (const JournalRecord& r : records) EXPECT_OK(state.Apply(r));
  JournalRecord snapshot = state.Snapshot();
  return snapshot.SerializeAsString();
}

// The snapshot is written while the service goes on: trainers consume and
// jobs report while the compaction is held in FinishCompaction; the
// compacted journal (the snapshot, then exactly the records enqueued after
// its mark) replays to the same state as the whole history.
TEST(CoordinatorCompactionTest, TheServiceGoesOnWhileTheSnapshotIsWritten) {
  FakeClock clock;
  MemoryJournal records;
  auto* held = new HeldCompactionJournal(&records);
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  options.journal_compact_bytes = 8192;  // in the first epoch
  options.journal_for_testing = [held] {
    return std::unique_ptr<Journal>(held);
  };
  auto created = CoordinatorService::Create(options);
  ASSERT_OK(created);
  CoordinatorService& service = **created;
  v1::JobSpec spec = Spec("j", {400, 300}, 1, 2);
  spec.set_max_samples_per_lease(5);
  ASSERT_OK(service.CreateJob(spec));
  // Whatever ends the test, the held compaction ends before the service.
  absl::Cleanup release = [held] {
    if (!held->release.HasBeenNotified()) held->release.Notify();
  };
  SimTrainer t(service, "j", 0, "t");
  int64_t consumed = 0;
  while (!held->begun.load() && consumed < 700) consumed += t.Consume(1);
  ASSERT_TRUE(held->begun.load()) << consumed;
  EXPECT_GT(consumed, 0);
  held->started.WaitForNotification();
  ASSERT_EQ(t.Consume(60), 60);
  EXPECT_EQ(service.GetJob("j", false)->status().ranks(0).consumed(),
            consumed + 60);
  const std::vector<JournalRecord> history = records.records();
  ASSERT_GT(history.size(), held->mark + 12);  // 60 samples, 12 leases
  held->release.Notify();
  EXPECT_EQ(service.WaitForCompactions(), 1);
  const std::vector<JournalRecord> compacted = records.records();
  ASSERT_EQ(compacted.size(), 1 + history.size() - held->mark);
  EXPECT_TRUE(compacted[0].has_snapshot());
  for (size_t i = 1; i < compacted.size(); ++i) {
    EXPECT_EQ(compacted[i].SerializeAsString(),
              history[held->mark + i - 1].SerializeAsString())
        << i;
  }
  EXPECT_EQ(Replayed(compacted), Replayed(history));
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// With no live data server, units wait and the stream says why; the first
// server to register gets them.
TEST(CoordinatorDataServerTest, UnitsWaitForALiveDataServer) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  auto created = CoordinatorService::Create(options);
  ASSERT_OK(created);
  CoordinatorService& service = **created;
  ASSERT_OK(service.CreateJob(Spec("j", {5, 5}, 1, 1)));
  SimTrainer t(service, "j", 0, "t");
  EXPECT_TRUE(t.held.empty());
  ASSERT_EQ(t.sink->Count(v1::CoordinatorMessage::kWaiting),
            0);  // Poll cleared the inbox
  service.OnMessage(t.session,
                    Want(3));          // ask again: still nothing to read from
  ASSERT_TRUE(t.sink->inbox.empty());  // the reason was already given once
  service.RegisterDataServer("10.0.0.1:7071", 1);
  t.Poll();
  ASSERT_EQ(t.held.size(), 2u);
  for (const v1::Lease& l : t.held) EXPECT_EQ(l.data_server(), "10.0.0.1:7071");
}

TEST(CoordinatorDataServerTest, TheWaitingReasonNamesTheMissingDataServer) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  auto created = CoordinatorService::Create(options);
  ASSERT_OK(created);
  ASSERT_OK((*created)->CreateJob(Spec("j", {5}, 1, 1)));
  auto sink = std::make_shared<RecordingSink>();
  OpenAndWantOne(**created, sink);
  ASSERT_EQ(sink->Count(v1::CoordinatorMessage::kWaiting), 1);
  for (const auto& m : sink->inbox) {
    if (m.has_waiting()) {
      EXPECT_THAT(m.waiting().reason(), HasSubstr("no live data server"));
      EXPECT_EQ(m.waiting().kind(), v1::WAITING_NO_DATA_SERVER);
    }
  }
  EXPECT_EQ(sink->Count(v1::CoordinatorMessage::kGrant), 0);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

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

namespace sluice {
namespace {

v1::TrainerMessage Beat(std::vector<uint64_t> counts, double sum) {
  v1::TrainerMessage m;
  auto* w = m.mutable_heartbeat()->mutable_input_wait();
  for (uint64_t c : counts) w->add_bucket_counts(c);
  w->set_sum_seconds(sum);
  return m;
}

// A service exporting its metrics into `registry_`.
class CoordinatorInputWaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.clock = &clock_;
    options.wait_for_data_servers = false;
    options.metrics = &metrics_;
    auto service = CoordinatorService::Create(options);
    ASSERT_OK(service);
    service_ = std::move(*service);
  }
  FakeClock clock_;
  prometheus::Registry registry_;
  CoordinatorMetrics metrics_{registry_};
  std::unique_ptr<CoordinatorService> service_;
};

// Heartbeats' input waits add up per rank in the job's status and in the
// job's sluice_trainer_input_wait_seconds histogram.
TEST_F(CoordinatorInputWaitTest, HeartbeatsFeedTheRankTotalAndTheHistogram) {
  ASSERT_OK(service_->CreateJob(Spec("j", {10, 10}, 2, 1)));
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<int64_t> ids;
  for (int rank = 0; rank < 2; ++rank) {
    sinks.push_back(std::make_shared<RecordingSink>());
    ids.push_back(service_->OpenSession(sinks.back()));
    service_->OnMessage(ids.back(),
                        Hello("j", rank, "t" + std::to_string(rank)));
  }
  // Rank 0: 3 samples buffered (bucket 0), one after 0.02 s (bucket 3);
  // then 2 more after 0.5 s each (bucket 5). Rank 1: only the 1st bucket.
  service_->OnMessage(ids[0], Beat({3, 0, 0, 1}, 0.02));
  service_->OnMessage(ids[0], Beat({0, 0, 0, 0, 0, 2}, 1.0));
  service_->OnMessage(ids[1], Beat({5}, 0));
  for (const auto& sink : sinks) EXPECT_FALSE(sink->finished.has_value());

  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  ASSERT_EQ(job->status().ranks_size(), 2);
  EXPECT_DOUBLE_EQ(job->status().ranks(0).input_wait_seconds(), 1.02);
  EXPECT_DOUBLE_EQ(job->status().ranks(1).input_wait_seconds(), 0);

  const prometheus::ClientMetric::Histogram* h = nullptr;
  std::vector<prometheus::MetricFamily> families = registry_.Collect();
  for (const auto& f : families) {
    if (f.name != "sluice_trainer_input_wait_seconds") continue;
    ASSERT_EQ(f.metric.size(), 1u);
    EXPECT_EQ(f.metric[0].label[0].value, "j");
    h = &f.metric[0].histogram;
  }
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->sample_count, 11u);
  EXPECT_DOUBLE_EQ(h->sample_sum, 1.02);
  // Cumulative counts at le = 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, ...
  std::vector<uint64_t> cumulative;
  for (const auto& b : h->bucket) cumulative.push_back(b.cumulative_count);
  EXPECT_EQ(cumulative,
            (std::vector<uint64_t>{8, 8, 8, 9, 9, 11, 11, 11, 11, 11}));
}

// Every call that takes the state lock is timed: one wait, one hold and one
// hold-CPU observation each (CreateJob, the planning thread offering the
// next epoch's plan, OpenSession, the Hello, a heartbeat).
TEST_F(CoordinatorInputWaitTest, EveryLockTakingIsTimed) {
  auto count = [&](const std::string& name) -> uint64_t {
    for (const auto& f : registry_.Collect()) {
      if (f.name == name) return f.metric[0].histogram.sample_count;
    }
    ADD_FAILURE() << name << " not exported";
    return 0;
  };
  const uint64_t holds = count("sluice_coordinator_lock_hold_seconds");
  const uint64_t waits = count("sluice_coordinator_lock_wait_seconds");
  const uint64_t cpu = count("sluice_coordinator_lock_hold_cpu_seconds");
  ASSERT_OK(service_->CreateJob(Spec("j", {10}, 1, 1)));
  service_->WaitForPlansAhead();
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = service_->OpenSession(sink);
  service_->OnMessage(id, Hello("j", 0, "t"));
  service_->OnMessage(id, Beat({1}, 0));
  EXPECT_EQ(count("sluice_coordinator_lock_hold_seconds"), holds + 5);
  EXPECT_EQ(count("sluice_coordinator_lock_wait_seconds"), waits + 5);
  EXPECT_EQ(count("sluice_coordinator_lock_hold_cpu_seconds"), cpu + 5);
}

// The CPU time under the lock is counted per session message kind: one
// series per TrainerMessage kind, and a message adds to its own kind's only.
TEST_F(CoordinatorInputWaitTest, LockCpuIsCountedPerMessageKind) {
  auto by_kind = [&] {
    std::map<std::string, double> out;
    for (const auto& f : registry_.Collect()) {
      if (f.name != "sluice_coordinator_message_lock_cpu_seconds_total")
        continue;
      for (const auto& m : f.metric) out[m.label[0].value] = m.counter.value;
    }
    return out;
  };
  std::map<std::string, double> before = by_kind();
  const auto* kinds = v1::TrainerMessage::descriptor()->FindOneofByName("msg");
  ASSERT_NE(kinds, nullptr);
  ASSERT_EQ(before.size(), static_cast<size_t>(kinds->field_count()));
  for (int i = 0; i < kinds->field_count(); ++i) {
    EXPECT_EQ(before.count(kinds->field(i)->name()), 1u)
        << kinds->field(i)->name();
  }
  ASSERT_OK(service_->CreateJob(Spec("j", {10}, 1, 1)));
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = service_->OpenSession(sink);
  service_->OnMessage(id, Hello("j", 0, "t"));
  std::map<std::string, double> after_hello = by_kind();
  EXPECT_GT(after_hello["hello"], before["hello"]);
  after_hello.erase("hello");
  before.erase("hello");
  EXPECT_EQ(after_hello, before);
  service_->OnMessage(id, Beat({1}, 0));
  std::map<std::string, double> after_beat = by_kind();
  EXPECT_GT(after_beat["heartbeat"], before["heartbeat"]);
  EXPECT_EQ(after_beat["want"], before["want"]);
  EXPECT_EQ(after_beat["complete"], before["complete"]);
}

// A report that is not one: too many buckets, a negative or non-finite sum,
// absurd counts. The session ends with INVALID_ARGUMENT naming the field;
// nothing is recorded.
TEST_F(CoordinatorInputWaitTest, HostileReportsEndTheSessionNamingTheField) {
  ASSERT_OK(service_->CreateJob(Spec("j", {10}, 1, 1)));
  const std::vector<std::pair<v1::TrainerMessage, std::string>> cases = {
      {Beat(std::vector<uint64_t>(11, 1), 0),
       "heartbeat.input_wait.bucket_counts has 11 entries"},
      {Beat({1}, -1), "heartbeat.input_wait.sum_seconds"},
      {Beat({1}, std::numeric_limits<double>::quiet_NaN()),
       "heartbeat.input_wait.sum_seconds"},
      {Beat({1}, std::numeric_limits<double>::infinity()),
       "heartbeat.input_wait.sum_seconds"},
      {Beat({uint64_t{1} << 41}, 1), "heartbeat.input_wait.bucket_counts"},
      {Beat({uint64_t{1} << 39, uint64_t{1} << 39, uint64_t{1} << 39}, 1),
       "heartbeat.input_wait.bucket_counts"},
  };
  for (const auto& [message, field] : cases) {
    auto sink = std::make_shared<RecordingSink>();
    const int64_t id = service_->OpenSession(sink);
    service_->OnMessage(id, Hello("j", 0, "t"));
    service_->OnMessage(id, message);
    ASSERT_TRUE(sink->finished.has_value()) << field;
    EXPECT_THAT(*sink->finished,
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)));
    service_->CloseSession(id);
  }
  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().ranks(0).input_wait_seconds(), 0);
}

}  // namespace
}  // namespace sluice
