// CoordinatorService: Lease expiry, stalls and the TTLs and heartbeats of big
// jobs.
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

using ::sluice::testing::Complete;
using ::sluice::testing::CoordinatorServiceTest;
using ::sluice::testing::FakeClock;
using ::sluice::testing::Hello;
using ::sluice::testing::OpenAndWantOne;
using ::sluice::testing::Progress;
using ::sluice::testing::RecordingSink;
using ::sluice::testing::Spec;
using ::sluice::testing::Want;

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
  release.mutable_release()->mutable_lease()->set_lease_id(a1[0].lease_id());
  release.mutable_release()->mutable_lease()->set_fence(a1[0].fence());
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

}  // namespace
}  // namespace sluice
