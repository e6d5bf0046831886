// sluice-coordinator binaries with --journal=etcd://... against a real etcd.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/etcd.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::ChildProcess;
using ::sluice::testing::Etcd;
using ::sluice::testing::ReadWholeFile;
using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

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
  absl::StatusOr<ServerProcess> b = absl::UnknownError("not started");
  std::thread starter([&] {
    b = ServerProcess::Start("sluice-coordinator", dir.path(), args,
                             absl::Seconds(60));
  });
  ASSERT_TRUE(
      AnotherLogShows(dir.path(), a->log_path, "standby;", absl::Seconds(30)));
  a->process.Kill();
  starter.join();
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
  absl::StatusOr<ServerProcess> b = absl::UnknownError("not started");
  std::thread starter([&] {
    b = ServerProcess::Start("sluice-coordinator", dir.path(), args,
                             absl::Seconds(60));
  });
  ASSERT_TRUE(
      AnotherLogShows(dir.path(), a->log_path, "standby;", absl::Seconds(30)));
  // The leader pauses longer than its lease: the standby takes over.
  a->process.Signal(SIGSTOP);
  starter.join();
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
