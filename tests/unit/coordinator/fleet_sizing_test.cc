// The coordinator feeds FleetSizer from the sessions' acknowledgements and
// input waits and the data servers' load reports.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "server/coordinator/coordinator_service.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using ::sluice::testing::FakeClock;

class Discard : public SessionSink {
 public:
  void Send(v1::CoordinatorMessage m) override {
    if (m.has_grant()) lease = m.grant().lease();
  }
  void Finish(const absl::Status&) override {}
  v1::Lease lease;
};

// A job reading 1,000 samples/s from pool `pool`, waiting `wait` of its
// time, and the one data server of that pool serving it (2 cores, 1,000
// samples per CPU second). The waits come in heartbeats, or (`in_sync`) in
// the Syncs a reader with reports to confirm sends instead.
struct PoolLoad {
  PoolLoad(CoordinatorService& service, const std::string& pool, double wait,
           bool in_sync = false)
      : service(service),
        wait(wait),
        in_sync(in_sync),
        sink(std::make_shared<Discard>()) {
    server = service.RegisterDataServer(
        (pool.empty() ? "default" : pool) + "-server:1", 1, nullptr, 0, "",
        pool);
    v1::JobSpec spec;
    spec.set_name("job-of-" + pool);
    spec.set_pool(pool);
    auto* shard = spec.mutable_manifest()->add_shards();
    shard->set_url("/data/" + pool + "-0.tar");
    shard->set_num_samples(1000000);
    spec.set_world_size(1);
    spec.set_num_epochs(1);
    spec.set_mode(v1::MODE_DYNAMIC);
    spec.set_max_samples_per_lease(1000000);
    spec.set_lease_ttl_ms(60000);
    EXPECT_OK(service.CreateJob(spec));
    session = service.OpenSession(sink);
    v1::TrainerMessage m;
    m.mutable_hello()->set_job(spec.name());
    m.mutable_hello()->set_trainer_id("t");
    service.OnMessage(session, m);
    m.Clear();
    m.mutable_want()->set_credits(1);
    service.OnMessage(session, m);
    service.Flush();
    load.cores = 2;
    service.DataServerHeartbeat(server, 0, &load);
  }
  // `seconds` more of reading and serving.
  void Run(int seconds) {
    t += seconds;
    load.samples_served += 1000 * seconds;
    load.cpu_seconds += seconds;
    service.DataServerHeartbeat(server, 0, &load);
    v1::TrainerMessage m;
    m.mutable_progress()->mutable_lease()->set_lease_id(sink->lease.lease_id());
    m.mutable_progress()->mutable_lease()->set_fence(sink->lease.fence());
    m.mutable_progress()->set_consumed(1000 * t);
    service.OnMessage(session, m);
    m.Clear();
    v1::InputWait* input_wait =
        in_sync ? m.mutable_sync()->mutable_input_wait()
                : m.mutable_heartbeat()->mutable_input_wait();
    if (in_sync) m.mutable_sync()->set_id(static_cast<uint64_t>(t));
    input_wait->add_bucket_counts(1000 * seconds);
    input_wait->set_sum_seconds(seconds * wait);
    service.OnMessage(session, m);
  }
  CoordinatorService& service;
  double wait;
  bool in_sync;
  std::shared_ptr<Discard> sink;
  int64_t server = 0;
  int64_t session = 0;
  DataServerRegistry::Load load;
  int t = 0;
};

// One trainer and one data server (PoolLoad, the default pool): the
// coordinator's answer after `seconds`, sized every 5 s.
int32_t Sized(double wait, int seconds, bool in_sync = false) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  auto created = CoordinatorService::Create(options);
  EXPECT_OK(created);
  CoordinatorService& service = **created;
  PoolLoad load(service, "", wait, in_sync);
  EXPECT_FALSE(load.sink->lease.lease_id().empty());
  EXPECT_EQ(service.desired_data_servers(), -1);
  service.SizeFleet();  // starts the counts
  for (int t = 5; t <= seconds; t += 5) {
    clock.Advance(absl::Seconds(5));
    load.Run(5);
    service.SizeFleet();
  }
  EXPECT_NEAR(service.input_wait_share(), wait, 1e-9);
  return service.desired_data_servers();
}

TEST(FleetSizingTest, AnInputBoundTrainerMakesTheCoordinatorWantMoreServers) {
  // 1,000/s at a 0.6 wait share: 2,500/s wanted, x 1.25 over 2,000/s per
  // server: 2, once the 30 s cool-down has passed.
  EXPECT_EQ(Sized(0.6, 25), 1);
  EXPECT_EQ(Sized(0.6, 35), 2);
}

TEST(FleetSizingTest, ABusyReadersWaitCountsWhenItComesInItsSyncs) {
  EXPECT_EQ(Sized(0.6, 35, /*in_sync=*/true), 2);
}

TEST(FleetSizingTest, ATrainerThatDoesNotWaitWantsNoMore) {
  EXPECT_EQ(Sized(0.0, 60), 1);
}

// A coordinator on a fake clock.
class PoolSizingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.clock = &clock_;
    auto created = CoordinatorService::Create(options);
    ASSERT_OK(created);
    service_ = std::move(*created);
  }
  FakeClock clock_;
  std::unique_ptr<CoordinatorService> service_;
};

// Each pool is sized for its own jobs on its own servers' capacity, its
// grants name only its own servers, and the overall answer is the sum.
TEST_F(PoolSizingTest, EachPoolIsSizedForItsOwnJobs) {
  FakeClock& clock = clock_;
  CoordinatorService& service = *service_;
  PoolLoad gpu(service, "gpu", 0.6);
  PoolLoad plain(service, "", 0.0);
  EXPECT_EQ(gpu.sink->lease.data_server(), "gpu-server:1");
  EXPECT_EQ(plain.sink->lease.data_server(), "default-server:1");
  service.SizeFleet();  // starts the counts
  for (int t = 5; t <= 35; t += 5) {
    clock.Advance(absl::Seconds(5));
    gpu.Run(5);
    plain.Run(5);
    service.SizeFleet();
  }
  const std::vector<v1::PoolFleet> pools = service.PoolFleets();
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_EQ(pools[0].pool(), "");
  EXPECT_EQ(pools[0].desired_data_servers(), 1);
  EXPECT_EQ(pools[0].live_data_servers(), 1);
  EXPECT_NEAR(pools[0].input_wait_share(), 0.0, 1e-9);
  EXPECT_EQ(pools[1].pool(), "gpu");
  EXPECT_EQ(pools[1].desired_data_servers(), 2);
  EXPECT_EQ(pools[1].live_data_servers(), 1);
  EXPECT_NEAR(pools[1].input_wait_share(), 0.6, 1e-9);
  EXPECT_EQ(service.desired_data_servers(), 3);
  EXPECT_NEAR(service.input_wait_share(), 0.3, 1e-9);
}

// A pool left with no job and no server is forgotten: it no longer adds
// its minimum of 1 to the total.
TEST_F(PoolSizingTest, APoolWithNoJobAndNoServerIsForgotten) {
  CoordinatorService& service = *service_;
  PoolLoad plain(service, "", 0.0);
  v1::JobSpec spec;
  spec.set_name("gone");
  spec.set_pool("gpu");
  auto* shard = spec.mutable_manifest()->add_shards();
  shard->set_url("/data/0.tar");
  shard->set_num_samples(10);
  spec.set_world_size(1);
  spec.set_num_epochs(1);
  ASSERT_OK(service.CreateJob(spec));
  service.SizeFleet();  // starts the counts
  clock_.Advance(absl::Seconds(5));
  service.SizeFleet();
  EXPECT_EQ(service.PoolFleets().size(), 2u);
  EXPECT_EQ(service.desired_data_servers(), 2);
  ASSERT_OK(service.DeleteJob("gone"));
  clock_.Advance(absl::Seconds(5));
  service.SizeFleet();
  const std::vector<v1::PoolFleet> pools = service.PoolFleets();
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools[0].pool(), "");
  EXPECT_EQ(service.desired_data_servers(), 1);
}

// A job whose pool has no live server waits, told which pool it needs,
// even while other pools' servers are live.
TEST_F(PoolSizingTest, AJobWaitsForAServerOfItsPool) {
  CoordinatorService& service = *service_;
  service.RegisterDataServer("a:1", 1);
  v1::JobSpec spec;
  spec.set_name("j");
  spec.set_pool("gpu");
  auto* shard = spec.mutable_manifest()->add_shards();
  shard->set_url("/data/0.tar");
  shard->set_num_samples(10);
  spec.set_world_size(1);
  spec.set_num_epochs(1);
  ASSERT_OK(service.CreateJob(spec));
  class Waits : public SessionSink {
   public:
    void Send(v1::CoordinatorMessage m) override {
      if (m.has_waiting()) waiting = m.waiting();
      if (m.has_grant()) lease = m.grant().lease();
    }
    void Finish(const absl::Status&) override {}
    v1::Waiting waiting;
    v1::Lease lease;
  };
  auto sink = std::make_shared<Waits>();
  const int64_t session = service.OpenSession(sink);
  v1::TrainerMessage m;
  m.mutable_hello()->set_job("j");
  m.mutable_hello()->set_trainer_id("t");
  service.OnMessage(session, m);
  m.Clear();
  m.mutable_want()->set_credits(1);
  service.OnMessage(session, m);
  service.Flush();
  EXPECT_EQ(sink->waiting.kind(), v1::WAITING_NO_DATA_SERVER);
  EXPECT_NE(sink->waiting.reason().find("no live data server of pool gpu"),
            std::string::npos)
      << sink->waiting.reason();
  EXPECT_TRUE(sink->lease.lease_id().empty());
  service.RegisterDataServer("g:1", 1, nullptr, 0, "", "gpu");
  service.Flush();
  EXPECT_EQ(sink->lease.data_server(), "g:1");
}

}  // namespace
}  // namespace sluice
