// sluice-coordinator binaries with --journal=etcd://... against a real etcd.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/common/loopback_port.h"
#include "sluice/reader.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/etcd.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tls_fixture.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::ChildProcess;
using ::sluice::testing::Etcd;
using ::sluice::testing::ReadWholeFile;
using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

v1::JobSpec Spec(const std::string& name) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_world_size(1);
  spec.set_num_epochs(1);
  spec.set_lease_ttl_ms(60000);
  spec.set_max_samples_per_lease(10);
  v1::Shard* shard = spec.mutable_manifest()->add_shards();
  shard->set_url("/data/shard-0.tar");
  shard->set_num_samples(100);
  return spec;
}

// Polls `path` (a server's log) until it holds `text`.
bool LogShows(const std::string& path, const std::string& text,
              absl::Duration timeout) {
  return testing::WaitForFileText(path, text, timeout);
}

// Starts a coordinator with `args` on 127.0.0.1:`port` (0 = any).
absl::StatusOr<ServerProcess> StartCoordinator(const std::string& dir,
                                               std::vector<std::string> args,
                                               int port = 0) {
  args.push_back(absl::StrCat("--listen=127.0.0.1:", port));
  return testing::StartServer("sluice-coordinator", dir, args);
}

std::string PortOf(const std::string& address) {
  return address.substr(address.rfind(':') + 1);
}

TEST(CoordinatorEtcdTest, AStandbyRefusesNamingTheLeaderThenTakesOverItsJobs) {
  TempDir dir;
  auto etcd = Etcd::Start(dir.path());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::vector<std::string> args = {
      absl::StrCat("--journal=etcd://", (*etcd)->endpoint(), "/sluice/test"),
      "--election_ttl=1s", "--wait_for_data_servers=false"};
  auto a = StartCoordinator(dir.path(), args);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(
      testing::WaitForReadiness(a->grpc_address, true, absl::Seconds(30)).ok());
  EXPECT_TRUE(testing::WaitForMetric(a->metrics_address,
                                     "sluice_coordinator_is_leader 1"));
  ASSERT_TRUE(testing::CreateJob(a->grpc_address, Spec("ha")).ok());
  auto lease = testing::FirstGrant(a->grpc_address, "ha", "trainer-1");
  ASSERT_TRUE(lease.ok()) << lease.status();

  // A second coordinator on the same prefix listens as a standby: not
  // ready, and every RPC (unary or stream) is UNAVAILABLE naming the leader.
  auto b = StartCoordinator(dir.path(), args);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(LogShows(b->log_path, "standby;", absl::Seconds(30)));
  EXPECT_TRUE(testing::WaitForMetric(b->metrics_address,
                                     "sluice_coordinator_is_leader 0"));
  EXPECT_TRUE(
      testing::WaitForReadiness(b->grpc_address, false, absl::Seconds(5)).ok());
  const absl::Status refused = testing::CreateJob(b->grpc_address, Spec("x"));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("standby coordinator"));
  auto hint = testing::NotLeaderHint(refused);
  ASSERT_TRUE(hint.ok()) << hint.status();
  EXPECT_THAT(*hint, ::testing::EndsWith(":" + PortOf(a->grpc_address)));
  auto no_session = testing::FirstGrant(b->grpc_address, "ha", "trainer-2");
  ASSERT_FALSE(no_session.ok());
  EXPECT_EQ(no_session.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(testing::NotLeaderHint(no_session.status()).value_or(""), *hint);

  a->process.Kill();
  ASSERT_TRUE(
      testing::WaitForReadiness(b->grpc_address, true, absl::Seconds(30)).ok());
  EXPECT_TRUE(LogShows(b->log_path, "recovered", absl::Seconds(1)));
  EXPECT_TRUE(testing::WaitForMetric(b->metrics_address,
                                     "sluice_coordinator_is_leader 1"));
  EXPECT_TRUE(testing::WaitForMetric(
      b->metrics_address, "sluice_coordinator_leader_changes_total 1"));

  // The job, and trainer-1's lease, survived: its session gets the same
  // lease back.
  auto again = testing::FirstGrant(b->grpc_address, "ha", "trainer-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->lease_id(), lease->lease_id());
  EXPECT_EQ(again->unit().begin(), lease->unit().begin());
  EXPECT_EQ(again->unit().end(), lease->unit().end());

  // A standby stops on SIGTERM like the leader.
  auto c = StartCoordinator(dir.path(), args);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(LogShows(c->log_path, "standby;", absl::Seconds(30)));
  for (ServerProcess* p : {&*c, &*b}) {
    p->process.Signal(SIGTERM);
    auto code = p->process.Wait(absl::Seconds(30));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0);
  }
}

TEST(CoordinatorEtcdTest, APausedLeaderIsDeposedAndExitsWithoutWriting) {
  TempDir dir;
  auto etcd = Etcd::Start(dir.path());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::vector<std::string> args = {
      absl::StrCat("--journal=etcd://", (*etcd)->endpoint(), "/sluice/split"),
      "--election_ttl=1s", "--wait_for_data_servers=false"};
  auto a = StartCoordinator(dir.path(), args);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(
      testing::WaitForReadiness(a->grpc_address, true, absl::Seconds(30)).ok());
  ASSERT_TRUE(testing::CreateJob(a->grpc_address, Spec("split")).ok());
  auto b = StartCoordinator(dir.path(), args);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(LogShows(b->log_path, "standby;", absl::Seconds(30)));
  // The leader pauses longer than its lease: the standby takes over.
  a->process.Signal(SIGSTOP);
  ASSERT_TRUE(
      testing::WaitForReadiness(b->grpc_address, true, absl::Seconds(30)).ok());
  auto first = testing::FirstGrant(b->grpc_address, "split", "trainer-b");
  ASSERT_TRUE(first.ok()) << first.status();
  // Resumed, the old leader finds its lease gone and exits before granting
  // or writing anything.
  a->process.Signal(SIGCONT);
  auto code = a->process.Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 75);
  EXPECT_TRUE(LogShows(a->log_path, "no longer leading", absl::Seconds(1)));
  // The new leader carries on: the next unit goes to the next trainer.
  auto second = testing::FirstGrant(b->grpc_address, "split", "trainer-c");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->lease_id(), first->lease_id());
  EXPECT_GE(second->unit().begin(), first->unit().end());
}

// 8 shards of 50 samples in `dir`/shards, and a 1-rank, 1-epoch job over
// them in units of 10.
v1::JobSpec WriteShards(const TempDir& dir, const std::string& job) {
  mkdir(dir.File("shards").c_str(), 0755);
  v1::JobSpec spec;
  spec.set_name(job);
  for (int s = 0; s < 8; ++s) {
    testing::TarWriter tar;
    for (int i = 0; i < 50; ++i) {
      tar.File(absl::StrCat("s", s, "_", i, ".cls"), std::to_string(i));
    }
    const std::string path = dir.File(absl::StrCat("shards/", s, ".tar"));
    testing::WriteFile(path, tar.Finish());
    v1::Shard* shard = spec.mutable_manifest()->add_shards();
    shard->set_url(path);
    shard->set_num_samples(50);
  }
  spec.set_world_size(1);
  spec.set_num_epochs(1);
  spec.set_shuffle(true);
  spec.set_seed(5);
  spec.set_max_samples_per_lease(10);
  spec.set_lease_ttl_ms(3000);
  return spec;
}

// What readers saw: per epoch, how often each (shard, index) came, and per
// rank, how many samples.
struct Seen {
  absl::Mutex mu;
  std::map<int64_t, std::map<std::pair<int, int64_t>, int>> samples
      ABSL_GUARDED_BY(mu);
  std::map<std::pair<int, int64_t>, int64_t> per_rank_epoch ABSL_GUARDED_BY(mu);
  int64_t delivered ABSL_GUARDED_BY(mu) = 0;
  int64_t reconnects ABSL_GUARDED_BY(mu) = 0;
};

// Reads `job` as `rank` until done into `seen`. ADD_FAILUREs on a reader
// error.
void ReadJob(const std::string& coordinator, const std::string& job, int rank,
             Seen* seen) {
  ReaderOptions o;
  o.coordinator = coordinator;
  o.job = job;
  o.rank = rank;
  o.buffer_samples = 32;
  o.progress_interval = absl::Milliseconds(100);
  o.reconnect_timeout = absl::Seconds(60);
  auto reader = Reader::Create(o);
  if (!reader.ok()) {
    ADD_FAILURE() << reader.status();
    return;
  }
  while (true) {
    auto e = (*reader)->Next();
    if (!e.ok()) {
      ADD_FAILURE() << "rank " << rank << ": " << e.status();
      break;
    }
    if (e->kind == ReaderEvent::Kind::kDone) break;
    if (e->kind != ReaderEvent::Kind::kSample) continue;
    absl::MutexLock lock(&seen->mu);
    ++seen->samples[e->sample.epoch][{e->sample.shard_index, e->sample.index}];
    ++seen->per_rank_epoch[{rank, e->sample.epoch}];
    ++seen->delivered;
  }
  absl::MutexLock lock(&seen->mu);
  seen->reconnects += (*reader)->stats().reconnects;
}

// Blocks until `seen` has `n` samples delivered.
void AwaitDelivered(Seen* seen, int64_t n) {
  std::pair<Seen*, int64_t> arg(seen, n);
  seen->mu.LockWhen(absl::Condition(
      +[](std::pair<Seen*, int64_t>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return a->first->delivered >= a->second;
      },
      &arg));
  seen->mu.Unlock();
}

// Every epoch in [0, epochs) holds each of `samples` samples exactly once,
// and each of `ranks` ranks got samples / ranks of it.
void ExpectExactlyOnce(Seen* seen, int epochs, int ranks, size_t samples) {
  absl::MutexLock lock(&seen->mu);
  for (int e = 0; e < epochs; ++e) {
    EXPECT_EQ(seen->samples[e].size(), samples) << "epoch " << e;
    for (const auto& [key, count] : seen->samples[e]) {
      EXPECT_EQ(count, 1) << "epoch " << e << ": " << key.first << "/"
                          << key.second;
    }
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ((seen->per_rank_epoch[{r, e}]),
                static_cast<int64_t>(samples) / ranks)
          << "epoch " << e << " rank " << r;
    }
  }
}

std::string ClusterJournal(const std::vector<std::unique_ptr<Etcd>>& members,
                           const std::string& prefix) {
  std::string url = "--journal=etcd://";
  for (size_t i = 0; i < members.size(); ++i) {
    absl::StrAppend(&url, i ? "," : "", members[i]->endpoint());
  }
  return url + prefix;
}

TEST(CoordinatorEtcdTest, FourRanksReadThreeEpochsExactlyOnceThroughTwoKills) {
  TempDir dir;
  auto members = Etcd::StartCluster(dir.path(), 3);
  ASSERT_TRUE(members.ok()) << members.status();
  v1::JobSpec spec = WriteShards(dir, "kills");
  spec.set_world_size(4);
  spec.set_num_epochs(3);
  const std::vector<std::string> args = {ClusterJournal(*members, "/sluice/k"),
                                         "--election_ttl=1s",
                                         "--heartbeat_interval=200ms"};
  // Two coordinators on fixed ports: the supervisor (this test) restarts a
  // killed one on its port, as a standby.
  const int ports[2] = {ReserveLoopbackPort(), ReserveLoopbackPort()};
  ASSERT_GT(ports[0], 0);
  ASSERT_GT(ports[1], 0);
  std::optional<ServerProcess> coordinators[2];
  for (int i = 0; i < 2; ++i) {
    auto c = StartCoordinator(dir.path(), args, ports[i]);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinators[i].emplace(std::move(*c));
    if (i == 0) {
      ASSERT_TRUE(testing::WaitForReadiness(coordinators[0]->grpc_address, true,
                                            absl::Seconds(30))
                      .ok());
    }
  }
  // Every client is given both coordinators.
  const std::string both =
      absl::StrCat("127.0.0.1:", ports[0], ",127.0.0.1:", ports[1]);
  std::vector<ServerProcess> data;
  for (int i = 0; i < 2; ++i) {
    auto d = testing::StartServer(
        "sluice-dataserver", dir.path(),
        {"--roots=" + dir.File("shards"), "--coordinator=" + both});
    ASSERT_TRUE(d.ok()) << d.status();
    data.push_back(std::move(*d));
  }
  ASSERT_TRUE(testing::WaitForMetric(coordinators[0]->metrics_address,
                                     "sluice_coordinator_data_servers 2"));
  ASSERT_TRUE(testing::CreateJob(coordinators[0]->grpc_address, spec).ok());

  // Two kills of whichever coordinator leads, at random moments of the
  // 1200 deliveries.
  const unsigned seed = std::random_device()();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 random(seed);
  const int64_t kill_at[2] = {
      std::uniform_int_distribution<int64_t>(60, 500)(random),
      std::uniform_int_distribution<int64_t>(650, 1100)(random)};
  Seen seen;
  std::thread supervisor([&] {
    for (int64_t at : kill_at) {
      AwaitDelivered(&seen, at);
      int leader = -1;
      for (int i = 0; i < 2 && leader < 0; ++i) {
        if (testing::WaitForReadiness(coordinators[i]->grpc_address, true,
                                      absl::Seconds(10))
                .ok()) {
          leader = i;
        }
      }
      if (leader < 0) {
        ADD_FAILURE() << "no coordinator leads";
        return;
      }
      coordinators[leader]->process.Kill();
      auto restarted = StartCoordinator(dir.path(), args, ports[leader]);
      if (!restarted.ok()) {
        ADD_FAILURE() << restarted.status();
        return;
      }
      coordinators[leader].emplace(std::move(*restarted));
    }
  });
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] { ReadJob(both, "kills", r, &seen); });
  }
  for (std::thread& t : ranks) t.join();
  supervisor.join();
  ExpectExactlyOnce(&seen, 3, 4, 400);
  absl::MutexLock lock(&seen.mu);
  EXPECT_GE(seen.reconnects, 2);
}

TEST(CoordinatorEtcdTest, WithoutAQuorumTheLeaderStepsDownAndResumesAfter) {
  TempDir dir;
  auto members = Etcd::StartCluster(dir.path(), 3);
  ASSERT_TRUE(members.ok()) << members.status();
  const v1::JobSpec spec = WriteShards(dir, "quorum");
  const std::vector<std::string> args = {ClusterJournal(*members, "/sluice/q"),
                                         "--election_ttl=1s",
                                         "--heartbeat_interval=200ms"};
  const int port = ReserveLoopbackPort();
  ASSERT_GT(port, 0);
  auto c = StartCoordinator(dir.path(), args, port);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(
      testing::WaitForReadiness(c->grpc_address, true, absl::Seconds(30)).ok());
  auto data = testing::StartServer(
      "sluice-dataserver", dir.path(),
      {"--roots=" + dir.File("shards"), "--coordinator=" + c->grpc_address});
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(testing::WaitForMetric(c->metrics_address,
                                     "sluice_coordinator_data_servers 1"));
  ASSERT_TRUE(testing::CreateJob(c->grpc_address, spec).ok());
  Seen seen;
  std::thread reader(
      [&] { ReadJob(c->grpc_address, "quorum", /*rank=*/0, &seen); });
  AwaitDelivered(&seen, 120);
  // Two of three members stop: etcd has no quorum, so the leader cannot
  // keep its lease or commit anything, and steps down.
  (*members)[1]->process().Signal(SIGSTOP);
  (*members)[2]->process().Signal(SIGSTOP);
  auto code = c->process.Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 75);
  EXPECT_TRUE(LogShows(c->log_path, "no longer leading", absl::Seconds(1)));
  // The quorum returns; the coordinator, restarted by its supervisor, leads
  // again and the epoch completes exactly once.
  (*members)[1]->process().Signal(SIGCONT);
  (*members)[2]->process().Signal(SIGCONT);
  auto again = StartCoordinator(dir.path(), args, port);
  ASSERT_TRUE(again.ok()) << again.status();
  reader.join();
  ExpectExactlyOnce(&seen, 1, 1, 400);
  EXPECT_TRUE(again->process.running())
      << ReadWholeFile(again->log_path).value_or("");
}

TEST(CoordinatorEtcdTest, AnEtcdMemberDyingMidEpochIsOnlyLatency) {
  TempDir dir;
  auto members = Etcd::StartCluster(dir.path(), 3);
  ASSERT_TRUE(members.ok()) << members.status();
  const v1::JobSpec spec = WriteShards(dir, "three");
  // The coordinator talks to the first member that accepts: member 0.
  // Killing it may take etcd's raft leader, and the new one is elected
  // after etcd's election timeout (1 s, randomized up to 2 s): no
  // keep-alive is answered meanwhile, so the election TTL must outlast
  // that plus a keep-alive interval (a third of the TTL), or the leader
  // steps down before its lease could lapse.
  auto c = StartCoordinator(
      dir.path(), {ClusterJournal(*members, "/sluice/three"),
                   "--heartbeat_interval=200ms", "--election_ttl=5s"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(
      testing::WaitForReadiness(c->grpc_address, true, absl::Seconds(30)).ok());
  auto data = testing::StartServer(
      "sluice-dataserver", dir.path(),
      {"--roots=" + dir.File("shards"), "--coordinator=" + c->grpc_address});
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(testing::WaitForMetric(c->metrics_address,
                                     "sluice_coordinator_data_servers 1"));
  ASSERT_TRUE(testing::CreateJob(c->grpc_address, spec).ok());
  Seen seen;
  std::thread reader(
      [&] { ReadJob(c->grpc_address, "three", /*rank=*/0, &seen); });
  AwaitDelivered(&seen, 120);
  (*members)[0]->process().Kill();
  reader.join();
  ExpectExactlyOnce(&seen, 1, 1, 400);
  // The coordinator carried on, on the other two members.
  EXPECT_TRUE(c->process.running());
  absl::MutexLock lock(&seen.mu);
  EXPECT_EQ(seen.reconnects, 0);
  EXPECT_THAT(ReadWholeFile(c->log_path).value_or(""),
              Not(HasSubstr("no longer leading")));
}

TEST(CoordinatorEtcdTest, TalksToEtcdOverMutualTls) {
  TempDir dir;
  auto pki = testing::MakeTestPki(dir.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto etcd = Etcd::Start(dir.path(), absl::Seconds(30), &*pki);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string journal =
      absl::StrCat("--journal=etcd://", (*etcd)->endpoint(), "/sluice/tls");
  auto c = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {journal, "--etcd_ca_cert=" + pki->ca_cert,
       "--etcd_cert=" + pki->client_cert, "--etcd_key=" + pki->client_key,
       "--wait_for_data_servers=false"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(
      testing::WaitForReadiness(c->grpc_address, true, absl::Seconds(30)).ok());
  ASSERT_TRUE(testing::CreateJob(c->grpc_address, Spec("tls")).ok());
  EXPECT_TRUE(LogShows(c->log_path, "leading", absl::Seconds(1)));
  // Without a client certificate etcd refuses the connection.
  const std::string log = dir.File("no-cert.log");
  auto refused = ChildProcess::Start(
      {testing::BinDir() + "/sluice-coordinator", "--listen=127.0.0.1:0",
       "--metrics_listen=127.0.0.1:0", journal,
       "--etcd_ca_cert=" + pki->ca_cert},
      log);
  ASSERT_TRUE(refused.ok());
  auto code = refused->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(ReadWholeFile(log).value_or(""), HasSubstr("unreachable"));
}

TEST(CoordinatorEtcdTest, UnreachableEtcdExitsOneNamingTheEndpoints) {
  TempDir dir;
  const std::string log = dir.File("coordinator.log");
  auto child = ChildProcess::Start(
      {testing::BinDir() + "/sluice-coordinator", "--listen=127.0.0.1:0",
       "--metrics_listen=127.0.0.1:0",
       "--journal=etcd://127.0.0.1:1,127.0.0.1:2/sluice"},
      log);
  ASSERT_TRUE(child.ok());
  auto code = child->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(ReadWholeFile(log).value_or(""),
              HasSubstr("etcd 127.0.0.1:1,127.0.0.1:2 unreachable"));
}

TEST(CoordinatorEtcdTest, ABadJournalUrlIsAUsageErrorNamingTheFlag) {
  TempDir dir;
  const std::string log = dir.File("coordinator.log");
  auto child = ChildProcess::Start(
      {testing::BinDir() + "/sluice-coordinator", "--listen=127.0.0.1:0",
       "--metrics_listen=127.0.0.1:0", "--journal=etcd://nowhere/sluice"},
      log);
  ASSERT_TRUE(child.ok());
  auto code = child->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 2);  // a bad flag value, as for every flag
  EXPECT_THAT(ReadWholeFile(log).value_or(""), HasSubstr("--journal="));
}

}  // namespace
}  // namespace sluice
