// Routing a reader's grants around the data servers it reported it cannot
// reach (UnreachableServers), while other readers keep them.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/coordinator/coordinator_service.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using ::sluice::testing::FakeClock;

class Inbox : public SessionSink {
 public:
  void Send(v1::CoordinatorMessage m) override {
    if (m.has_grant()) grants.push_back(m.grant().lease());
  }
  void Finish(const absl::Status&) override {}
  std::deque<v1::Lease> grants;
};

class ReaderRoutingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.clock = &clock_;
    options.wait_for_data_servers = false;
    auto created = CoordinatorService::Create(options);
    ASSERT_OK(created);
    service_ = std::move(*created);
    a_ = service_->RegisterDataServer("a:1", 1);
    b_ = service_->RegisterDataServer("b:1", 1);
    // 200 shards of 2 samples, units of one shard: both servers get
    // about half of the shards.
    v1::JobSpec spec;
    spec.set_name("j");
    for (int i = 0; i < 200; ++i) {
      auto* shard = spec.mutable_manifest()->add_shards();
      shard->set_url("/data/shard-" + std::to_string(i) + ".tar");
      shard->set_num_samples(2);
    }
    spec.set_world_size(2);
    spec.set_num_epochs(1);
    spec.set_mode(v1::MODE_DYNAMIC);
    spec.set_shuffle_window(1);
    spec.set_lease_ttl_ms(60000);
    ASSERT_OK(service_->CreateJob(spec));
    for (int rank = 0; rank < 2; ++rank) {
      sessions_[rank] = service_->OpenSession(inbox_[rank]);
      v1::TrainerMessage hello;
      hello.mutable_hello()->set_job("j");
      hello.mutable_hello()->set_rank(rank);
      hello.mutable_hello()->set_trainer_id("t" + std::to_string(rank));
      service_->OnMessage(sessions_[rank], hello);
    }
  }
  // Advances the clock with both data servers heartbeating.
  void Advance(absl::Duration d) {
    clock_.Advance(d);
    service_->DataServerHeartbeat(a_);
    service_->DataServerHeartbeat(b_);
  }
  // `rank` takes `n` grants, one at a time, completing each; returns how
  // many named each server.
  std::map<std::string, int> Take(int rank, int n) {
    std::map<std::string, int> servers;
    for (int i = 0; i < n; ++i) {
      const v1::Lease l = Next(rank);
      ++servers[l.data_server()];
      v1::TrainerMessage done;
      done.mutable_complete()->mutable_lease()->set_lease_id(l.lease_id());
      done.mutable_complete()->mutable_lease()->set_fence(l.fence());
      service_->OnMessage(sessions_[rank], done);
    }
    return servers;
  }
  // The next grant `rank` holds (the session wants one lease at a time: a
  // lease given back or completed is replaced at once).
  v1::Lease Next(int rank) {
    std::deque<v1::Lease>& grants = inbox_[rank]->grants;
    if (grants.empty()) {
      v1::TrainerMessage want;
      want.mutable_want()->set_credits(1);
      service_->OnMessage(sessions_[rank], want);
      service_->Flush();
    }
    EXPECT_EQ(grants.size(), 1u);
    if (grants.empty()) return v1::Lease();
    v1::Lease l = grants.front();
    grants.pop_front();
    return l;
  }
  // `rank` reports the lease's server unreachable and gives the lease back
  // (a replacement is granted at once).
  void Reroute(int rank, const v1::Lease& l) {
    v1::TrainerMessage m;
    m.mutable_reroute()->mutable_lease()->set_lease_id(l.lease_id());
    m.mutable_reroute()->mutable_lease()->set_fence(l.fence());
    m.mutable_reroute()->set_failed_data_server(l.data_server());
    m.mutable_reroute()->set_error(l.data_server() + ": connect timed out");
    service_->OnMessage(sessions_[rank], m);
  }
  // Grants `rank` until one names `server`; false if none of `n` does.
  bool GrantOn(int rank, const std::string& server, int n, v1::Lease* out) {
    for (int i = 0; i < n; ++i) {
      *out = Next(rank);
      if (out->data_server() == server) return true;
      v1::TrainerMessage done;
      done.mutable_complete()->mutable_lease()->set_lease_id(out->lease_id());
      done.mutable_complete()->mutable_lease()->set_fence(out->fence());
      service_->OnMessage(sessions_[rank], done);
    }
    return false;
  }

  FakeClock clock_;
  std::unique_ptr<CoordinatorService> service_;
  int64_t a_ = 0, b_ = 0;
  std::shared_ptr<Inbox> inbox_[2] = {std::make_shared<Inbox>(),
                                      std::make_shared<Inbox>()};
  int64_t sessions_[2] = {0, 0};
};

TEST_F(ReaderRoutingTest, AReaderThatCannotReachAServerIsRoutedAroundIt) {
  v1::Lease on_a;
  ASSERT_TRUE(GrantOn(0, "a:1", 20, &on_a));
  Reroute(0, on_a);
  // Past the 3 s in which every reader passes a:1 over after the report,
  // within the 10 s in which rank 0 alone does.
  Advance(absl::Seconds(4));
  const std::map<std::string, int> rank0 = Take(0, 20);
  EXPECT_EQ(rank0, (std::map<std::string, int>{{"b:1", 20}}));
  const std::map<std::string, int> rank1 = Take(1, 20);
  EXPECT_GT(rank1.count("a:1") ? rank1.at("a:1") : 0, 3);
  EXPECT_GT(rank1.count("b:1") ? rank1.at("b:1") : 0, 3);
}

TEST_F(ReaderRoutingTest, AfterTheWaitTheServerIsTriedAgainAndSamplesClearIt) {
  v1::Lease on_a;
  ASSERT_TRUE(GrantOn(0, "a:1", 20, &on_a));
  Reroute(0, on_a);
  Advance(absl::Seconds(10));
  // Tried again: it fails again, and is passed over twice as long.
  ASSERT_TRUE(GrantOn(0, "a:1", 20, &on_a));
  Reroute(0, on_a);
  Advance(absl::Seconds(19));
  EXPECT_EQ(Take(0, 20), (std::map<std::string, int>{{"b:1", 20}}));
  Advance(absl::Seconds(1));
  ASSERT_TRUE(GrantOn(0, "a:1", 20, &on_a));
  // This time samples arrive from a:1: it is forgotten, so a later
  // failure waits the initial 10 s again, not 40 s.
  v1::TrainerMessage progress;
  progress.mutable_progress()->mutable_lease()->set_lease_id(on_a.lease_id());
  progress.mutable_progress()->mutable_lease()->set_fence(on_a.fence());
  progress.mutable_progress()->set_consumed(1);
  service_->OnMessage(sessions_[0], progress);
  v1::TrainerMessage done;
  done.mutable_complete()->mutable_lease()->set_lease_id(on_a.lease_id());
  done.mutable_complete()->mutable_lease()->set_fence(on_a.fence());
  service_->OnMessage(sessions_[0], done);
  ASSERT_TRUE(GrantOn(0, "a:1", 20, &on_a));
  Reroute(0, on_a);
  Advance(absl::Seconds(10));
  const std::map<std::string, int> rank0 = Take(0, 20);
  EXPECT_GT(rank0.count("a:1") ? rank0.at("a:1") : 0, 3);
}

// One shuffle window (8 shards, fewer than the window of 32): its units
// spread over both servers when the shards are local files, and all go to
// one server when they are remote (each shard downloaded once).
TEST_F(ReaderRoutingTest, AWindowsUnitsSpreadOverTheServersUnlessRemote) {
  for (const char* prefix : {"/data/w-", "https://host/w-"}) {
    v1::JobSpec spec;
    spec.set_name(prefix[0] == '/' ? "local" : "remote");
    for (int i = 0; i < 8; ++i) {
      auto* shard = spec.mutable_manifest()->add_shards();
      shard->set_url(prefix + std::to_string(i) + ".tar");
      shard->set_num_samples(25);
    }
    spec.set_world_size(0);
    spec.set_num_epochs(1);
    spec.set_mode(v1::MODE_DYNAMIC);
    spec.set_shuffle(true);
    spec.set_max_samples_per_lease(5);
    ASSERT_OK(service_->CreateJob(spec));
    auto inbox = std::make_shared<Inbox>();
    const int64_t id = service_->OpenSession(inbox);
    v1::TrainerMessage hello;
    hello.mutable_hello()->set_job(spec.name());
    hello.mutable_hello()->set_trainer_id("w");
    service_->OnMessage(id, hello);
    v1::TrainerMessage want;
    want.mutable_want()->set_credits(40);
    service_->OnMessage(id, want);
    service_->Flush();
    std::map<std::string, int> servers;
    for (const v1::Lease& l : inbox->grants) {
      EXPECT_EQ(l.unit().window().pieces_size(),
                8);  // one window of all 8 shards
      ++servers[l.data_server()];
    }
    ASSERT_EQ(inbox->grants.size(), 40u);
    if (spec.name() == "local") {
      ASSERT_EQ(servers.size(), 2u);
      EXPECT_GT(servers["a:1"], 8);
      EXPECT_GT(servers["b:1"], 8);
    } else {
      EXPECT_EQ(servers.size(), 1u);
    }
    service_->CloseSession(id);
  }
}

}  // namespace
}  // namespace sluice
