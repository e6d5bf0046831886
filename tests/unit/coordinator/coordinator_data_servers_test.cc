// CoordinatorService: Grants and data servers: routing, lease tokens,
// heartbeats, waiting for a server.
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
using ::sluice::testing::FakeClock;
using ::sluice::testing::Hello;
using ::sluice::testing::OpenAndWantOne;
using ::sluice::testing::RecordingSink;
using ::sluice::testing::SimTrainer;
using ::sluice::testing::Spec;
using ::sluice::testing::StatusIs;
using ::sluice::testing::Want;
using ::testing::HasSubstr;

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
    routes[l.unit().shard().url()] = l.data_server();
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
    ASSERT_TRUE(u.has_window());
    const v1::WindowUnit& wu = u.window();
    ASSERT_LT(wu.window_index(), 2);
    const ShuffleWindow& w = windows[static_cast<size_t>(wu.window_index())];
    EXPECT_EQ(wu.window_order(), w.order_seed);
    ASSERT_EQ(wu.pieces_size(), static_cast<int>(w.shards.size()));
    for (int k = 0; k < wu.pieces_size(); ++k) {
      EXPECT_EQ(wu.pieces(k).shard_index(), w.shards[k]);
      EXPECT_EQ(wu.pieces(k).url(),
                "/data/shard-" + std::to_string(w.shards[k]) + ".tar");
      EXPECT_EQ(wu.pieces(k).num_samples(), sizes[w.shards[k]]);
    }
    EXPECT_LE(u.end() - u.begin(), 7);
    EXPECT_LE(u.end(), w.samples);
    covered[wu.window_index()] += u.end() - u.begin();
    servers[wu.window_index()].insert(l.data_server());
  }
  EXPECT_EQ(covered[0], windows[0].samples);
  EXPECT_EQ(covered[1], windows[1].samples);
  EXPECT_EQ(servers[0].size(), 2u);
  EXPECT_EQ(servers[1].size(), 2u);
  service_->CloseSession(id);
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
