// The coordinator feeds FleetSizer from the sessions' acknowledgements and
// input waits and the data servers' load reports.
#include <gtest/gtest.h>

#include <memory>
#include <string>

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

// One trainer reading 1,000 samples/s and waiting `wait` of its time; one
// data server serving them on 2 cores at 1,000 samples per CPU second.
// Returns the coordinator's answer after `seconds`, sized every 5 s. The
// waits come in heartbeats, or (`in_sync`) in the Syncs a reader with
// reports to confirm sends instead.
int32_t Sized(double wait, int seconds, bool in_sync = false) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  auto created = CoordinatorService::Create(options);
  EXPECT_OK(created);
  CoordinatorService& service = **created;
  const int64_t server = service.RegisterDataServer("a:1", 1);
  v1::JobSpec spec;
  spec.set_name("j");
  auto* shard = spec.mutable_manifest()->add_shards();
  shard->set_url("/data/shard-0.tar");
  shard->set_num_samples(1000000);
  spec.set_world_size(1);
  spec.set_num_epochs(1);
  spec.set_mode(v1::MODE_DYNAMIC);
  spec.set_max_samples_per_lease(1000000);
  spec.set_lease_ttl_ms(60000);
  EXPECT_OK(service.CreateJob(spec));
  auto sink = std::make_shared<Discard>();
  const int64_t session = service.OpenSession(sink);
  v1::TrainerMessage m;
  m.mutable_hello()->set_job("j");
  m.mutable_hello()->set_trainer_id("t");
  service.OnMessage(session, m);
  m.Clear();
  m.mutable_want()->set_credits(1);
  service.OnMessage(session, m);
  service.Flush();
  EXPECT_FALSE(sink->lease.lease_id().empty());
  EXPECT_EQ(service.desired_data_servers(), -1);
  DataServerRegistry::Load load;
  load.cores = 2;
  service.DataServerHeartbeat(server, 0, &load);
  service.SizeFleet();  // starts the counts
  for (int t = 5; t <= seconds; t += 5) {
    clock.Advance(absl::Seconds(5));
    load.samples_served += 5000;
    load.cpu_seconds += 5.0;
    service.DataServerHeartbeat(server, 0, &load);
    m.Clear();
    m.mutable_progress()->set_lease_id(sink->lease.lease_id());
    m.mutable_progress()->set_fence(sink->lease.fence());
    m.mutable_progress()->set_consumed(1000 * t);
    service.OnMessage(session, m);
    m.Clear();
    v1::InputWait* input_wait =
        in_sync ? m.mutable_sync()->mutable_input_wait()
                : m.mutable_heartbeat()->mutable_input_wait();
    if (in_sync) m.mutable_sync()->set_id(static_cast<uint64_t>(t));
    input_wait->add_bucket_counts(5000);
    input_wait->set_sum_seconds(5 * wait);
    service.OnMessage(session, m);
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

}  // namespace
}  // namespace sluice
