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
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
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

// Polls the coordinator logs in `dir` other than `except` until one holds
// `text`.
bool AnotherLogShows(const std::string& dir, const std::string& except,
                     const std::string& text, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string path = entry.path().string();
      if (path == except ||
          path.find("sluice-coordinator") == std::string::npos ||
          entry.path().extension() != ".log") {
        continue;
      }
      std::optional<std::string> log = ReadWholeFile(path);
      if (log && log->find(text) != std::string::npos) return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Polls `path` (a server's log) until it holds `text`.
bool LogShows(const std::string& path, const std::string& text,
              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::optional<std::string> log = ReadWholeFile(path);
    if (log && log->find(text) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Starts a standby coordinator on a thread (ServerProcess::Start returns
// once it leads and listens). A test that ends early kills the leader, so
// the start ends, and joins the thread.
class StandbyStart {
 public:
  StandbyStart(ServerProcess& leader, const std::string& dir,
               const std::vector<std::string>& args)
      : leader_(leader), thread_([this, dir, args] {
          result_ = ServerProcess::Start("sluice-coordinator", dir, args,
                                         absl::Seconds(90));
        }) {}
  ~StandbyStart() {
    if (!thread_.joinable()) return;
    leader_.process.Kill();
    thread_.join();
  }
  absl::StatusOr<ServerProcess>& Join() {
    thread_.join();
    return result_;
  }

 private:
  ServerProcess& leader_;
  absl::StatusOr<ServerProcess> result_ = absl::UnknownError("not started");
  std::thread thread_;
};

TEST(CoordinatorEtcdTest, AStandbyTakesOverTheJobsAndLeasesOfAKilledLeader) {
  TempDir dir;
  auto etcd = Etcd::Start(dir.path());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::vector<std::string> args = {
      absl::StrCat("--journal=etcd://", (*etcd)->endpoint(), "/sluice/test"),
      "--election_ttl=1s", "--wait_for_data_servers=false"};
  auto a = ServerProcess::Start("sluice-coordinator", dir.path(), args);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(testing::CreateJob(a->grpc_address, Spec("ha")).ok());
  auto lease = testing::FirstGrant(a->grpc_address, "ha", "trainer-1");
  ASSERT_TRUE(lease.ok()) << lease.status();

  // A second coordinator on the same prefix waits as a standby (it does not
  // listen until it leads).
  StandbyStart standby(*a, dir.path(), args);
  ASSERT_TRUE(
      AnotherLogShows(dir.path(), a->log_path, "standby;", absl::Seconds(30)));
  a->process.Kill();
  absl::StatusOr<ServerProcess>& b = standby.Join();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(LogShows(b->log_path, "recovered", absl::Seconds(1)));

  // The job, and trainer-1's lease, survived: its session gets the same
  // lease back.
  auto again = testing::FirstGrant(b->grpc_address, "ha", "trainer-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->lease_id(), lease->lease_id());
  EXPECT_EQ(again->unit().begin(), lease->unit().begin());
  EXPECT_EQ(again->unit().end(), lease->unit().end());
  b->process.Signal(SIGTERM);
  auto code = b->process.WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

TEST(CoordinatorEtcdTest, APausedLeaderIsDeposedAndExitsWithoutWriting) {
  TempDir dir;
  auto etcd = Etcd::Start(dir.path());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::vector<std::string> args = {
      absl::StrCat("--journal=etcd://", (*etcd)->endpoint(), "/sluice/split"),
      "--election_ttl=1s", "--wait_for_data_servers=false"};
  auto a = ServerProcess::Start("sluice-coordinator", dir.path(), args);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(testing::CreateJob(a->grpc_address, Spec("split")).ok());
  StandbyStart standby(*a, dir.path(), args);
  ASSERT_TRUE(
      AnotherLogShows(dir.path(), a->log_path, "standby;", absl::Seconds(30)));
  // The leader pauses longer than its lease: the standby takes over.
  a->process.Signal(SIGSTOP);
  absl::StatusOr<ServerProcess>& b = standby.Join();
  ASSERT_TRUE(b.ok()) << b.status();
  auto first = testing::FirstGrant(b->grpc_address, "split", "trainer-b");
  ASSERT_TRUE(first.ok()) << first.status();
  // Resumed, the old leader finds its lease gone and exits before granting
  // or writing anything.
  a->process.Signal(SIGCONT);
  auto code = a->process.WaitForExit(absl::Seconds(30));
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

// Reads `job` as rank 0 until done: how often each (shard, index) came;
// `after(n)` runs after the n-th sample. ADD_FAILUREs on a reader error.
std::map<std::pair<int, int64_t>, int> ReadEpoch(
    const std::string& coordinator, const std::string& job, int64_t* reconnects,
    const std::function<void(int64_t)>& after) {
  std::map<std::pair<int, int64_t>, int> seen;
  ReaderOptions o;
  o.coordinator = coordinator;
  o.job = job;
  o.rank = 0;
  o.buffer_samples = 32;
  o.progress_interval = absl::Milliseconds(100);
  o.reconnect_timeout = absl::Seconds(60);
  auto reader = Reader::Create(o);
  if (!reader.ok()) {
    ADD_FAILURE() << reader.status();
    return seen;
  }
  int64_t n = 0;
  while (true) {
    auto e = (*reader)->Next();
    if (!e.ok()) {
      ADD_FAILURE() << e.status();
      break;
    }
    if (e->kind == ReaderEvent::Kind::kDone) break;
    if (e->kind != ReaderEvent::Kind::kSample) continue;
    ++seen[{e->sample.shard_index, e->sample.index}];
    after(++n);
  }
  *reconnects = (*reader)->stats().reconnects;
  return seen;
}

TEST(CoordinatorEtcdTest, ReadersAndDataServersFollowTheLeaderThroughFailover) {
  TempDir dir;
  auto etcd = Etcd::Start(dir.path());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const v1::JobSpec spec = WriteShards(dir, "failover");
  const std::vector<std::string> args = {
      absl::StrCat("--journal=etcd://", (*etcd)->endpoint(), "/sluice/fo"),
      "--election_ttl=1s", "--heartbeat_interval=200ms"};
  auto a = ServerProcess::Start("sluice-coordinator", dir.path(), args);
  ASSERT_TRUE(a.ok()) << a.status();
  const int standby_port = ReserveLoopbackPort();
  ASSERT_GT(standby_port, 0);
  std::vector<std::string> b_args = args;
  b_args.push_back(absl::StrCat("--listen=127.0.0.1:", standby_port));
  StandbyStart standby(*a, dir.path(), b_args);
  ASSERT_TRUE(
      AnotherLogShows(dir.path(), a->log_path, "standby;", absl::Seconds(30)));
  // Every client is given both coordinators.
  const std::string both =
      absl::StrCat(a->grpc_address, ",127.0.0.1:", standby_port);
  auto data = ServerProcess::Start(
      "sluice-dataserver", dir.path(),
      {"--roots=" + dir.File("shards"), "--coordinator=" + both});
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(testing::WaitForMetric(a->metrics_address,
                                     "sluice_coordinator_data_servers 1"));
  ASSERT_TRUE(testing::CreateJob(a->grpc_address, spec).ok());

  int64_t reconnects = 0;
  const auto seen = ReadEpoch(both, "failover", &reconnects, [&](int64_t n) {
    if (n == 120) a->process.Kill();  // the leader dies mid-epoch
  });
  absl::StatusOr<ServerProcess>& b = standby.Join();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(seen.size(), 400u);
  for (const auto& [key, count] : seen) {
    EXPECT_EQ(count, 1) << key.first << "/" << key.second;
  }
  EXPECT_GE(reconnects, 1);
}

TEST(CoordinatorEtcdTest, AnEtcdMemberDyingMidEpochIsOnlyLatency) {
  TempDir dir;
  auto members = Etcd::StartCluster(dir.path(), 3);
  ASSERT_TRUE(members.ok()) << members.status();
  const v1::JobSpec spec = WriteShards(dir, "three");
  // The coordinator talks to the first member that accepts: member 0.
  auto c = ServerProcess::Start(
      "sluice-coordinator", dir.path(),
      {absl::StrCat("--journal=etcd://", (*members)[0]->endpoint(), ",",
                    (*members)[1]->endpoint(), ",", (*members)[2]->endpoint(),
                    "/sluice/three"),
       "--heartbeat_interval=200ms"});
  ASSERT_TRUE(c.ok()) << c.status();
  auto data = ServerProcess::Start(
      "sluice-dataserver", dir.path(),
      {"--roots=" + dir.File("shards"), "--coordinator=" + c->grpc_address});
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(testing::WaitForMetric(c->metrics_address,
                                     "sluice_coordinator_data_servers 1"));
  ASSERT_TRUE(testing::CreateJob(c->grpc_address, spec).ok());
  int64_t reconnects = 0;
  const auto seen =
      ReadEpoch(c->grpc_address, "three", &reconnects, [&](int64_t n) {
        if (n == 120) (*members)[0]->process().Kill();
      });
  EXPECT_EQ(seen.size(), 400u);
  for (const auto& [key, count] : seen) {
    EXPECT_EQ(count, 1) << key.first << "/" << key.second;
  }
  // The coordinator carried on, on the other two members.
  EXPECT_TRUE(c->process.running());
  EXPECT_EQ(reconnects, 0);
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
  auto c = ServerProcess::Start(
      "sluice-coordinator", dir.path(),
      {journal, "--etcd_ca_cert=" + pki->ca_cert,
       "--etcd_cert=" + pki->client_cert, "--etcd_key=" + pki->client_key,
       "--wait_for_data_servers=false"});
  ASSERT_TRUE(c.ok()) << c.status();
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
  auto code = refused->WaitForExit(absl::Seconds(60));
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
  auto code = child->WaitForExit(absl::Seconds(60));
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
  auto code = child->WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 2);  // a bad flag value, as for every flag
  EXPECT_THAT(ReadWholeFile(log).value_or(""), HasSubstr("--journal="));
}

}  // namespace
}  // namespace sluice
