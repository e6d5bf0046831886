// sluicectl as users run it: the demo end to end, index -> job create ->
// read, health, and the error paths (exit codes and messages).
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "server/common/loopback_port.h"
#include "sluice/v1/coordinator.pb.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_cluster.h"
#include "tests/testing/tls_fixture.h"

namespace sluice {
namespace {

using ::sluice::testing::ChildProcess;
using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::sluice::testing::TestCluster;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

struct CtlRun {
  int code = -1;
  std::string output;  // stdout + stderr
  absl::Duration took;
};

CtlRun Ctl(const TempDir& dir, std::vector<std::string> args,
           absl::Duration timeout = absl::Seconds(60)) {
  static int n = 0;
  std::string log = dir.File(absl::StrCat("ctl-", n++, ".log"));
  args.insert(args.begin(), testing::BinDir() + "/sluicectl");
  const absl::Time start = absl::Now();
  auto child = ChildProcess::Start(args, log);
  CtlRun run;
  if (!child.ok()) return run;
  auto code = child->Wait(timeout);
  run.took = absl::Now() - start;
  run.code = code.ok() ? *code : -1;
  run.output = testing::ReadWholeFile(log).value_or("");
  return run;
}

TEST(SluicectlTest, DemoVerifies) {
  TempDir dir;
  CtlRun run = Ctl(dir, {"demo", "--dir=" + dir.path()}, absl::Seconds(150));
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("VERIFIED"));
  EXPECT_THAT(run.output, HasSubstr("samples per rank 750 750 750 750"));
  EXPECT_THAT(run.output, HasSubstr("SIGKILLed rank 1's trainer"));
  // The data server dies while epoch 1 is being read (the demo kills it
  // once half of the epoch is delivered), not after the epoch is over: the
  // paced readers do not make up for the wait at the epoch boundary in a
  // burst.
  const size_t killed = run.output.find("SIGKILLed data server ");
  ASSERT_NE(killed, std::string::npos) << run.output;
  const std::string line =
      run.output.substr(killed, run.output.find('\n', killed) - killed);
  std::vector<std::string> words = absl::StrSplit(line, ' ');
  int64_t at = 0;
  ASSERT_EQ(words.size(), 10u) << line;
  ASSERT_TRUE(absl::SimpleAtoi(words[5], &at)) << line;
  EXPECT_GE(at, 1500) << line;
  EXPECT_LT(at, 3000) << line;
  // The lease counts come from the coordinator's GetJob: the killed
  // trainer's leases expired.
  EXPECT_THAT(run.output,
              ContainsRegex("leases granted [1-9][0-9]*, expired [1-9]"));
  EXPECT_LT(run.took, absl::Minutes(2));
}

TEST(SluicectlTest, IndexCreateReadHealth) {
  TempDir dir;
  TestCluster cluster(dir.path());
  for (int s = 0; s < 3; ++s) {
    cluster.WriteShard(absl::StrCat(s), 4 + s,
                       [s](testing::TarWriter& tar, int i) {
                         tar.File(absl::StrCat("k", s, i, ".cls"), "1");
                       });
  }
  CtlRun index =
      Ctl(dir, {"index", cluster.shards_dir(), "-o", dir.File("m.json")});
  ASSERT_EQ(index.code, 0) << index.output;
  EXPECT_THAT(index.output, HasSubstr("indexed 3 shards, 15 samples"));
  std::string manifest =
      testing::ReadWholeFile(dir.File("m.json")).value_or("");
  EXPECT_THAT(manifest, HasSubstr("\"num_samples\": \"6\""));

  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartDataServers(1).ok());
  const std::string c = "--coordinator=" + cluster.coordinator().grpc_address;
  CtlRun health = Ctl(dir, {"health", cluster.coordinator().grpc_address,
                            "--service=readiness"});
  EXPECT_EQ(health.code, 0) << health.output;
  EXPECT_THAT(health.output, HasSubstr("SERVING"));

  CtlRun create = Ctl(
      dir, {"job", "create", "--name=small", "--manifest=" + dir.File("m.json"),
            "--world_size=1", "--epochs=1", c});
  ASSERT_EQ(create.code, 0) << create.output;
  EXPECT_THAT(create.output,
              HasSubstr("order: shards shuffled, samples mixed in windows of "
                        "32 shards"));
  CtlRun ordered =
      Ctl(dir, {"job", "create", "--name=ordered",
                "--manifest=" + dir.File("m.json"), "--noshuffle", c});
  EXPECT_THAT(ordered.output, HasSubstr("order: manifest order every epoch"));
  CtlRun one =
      Ctl(dir, {"job", "create", "--name=one-shard-units",
                "--manifest=" + dir.File("m.json"), "--shuffle_window=1", c});
  EXPECT_THAT(one.output, HasSubstr("each unit from one shard"));
  CtlRun wide = Ctl(
      dir, {"job", "create", "--name=wide", "--manifest=" + dir.File("m.json"),
            "--shuffle_window=5000", c});
  EXPECT_EQ(wide.code, 1);
  EXPECT_THAT(wide.output, HasSubstr("spec.shuffle_window: 5000 is outside"));
  CtlRun read = Ctl(dir, {"read", "--job=small", "--rank=0", c});
  ASSERT_EQ(read.code, 0) << read.output;
  int lines = 0;
  for (absl::string_view l : absl::StrSplit(read.output, '\n')) {
    if (absl::StartsWith(l, "{\"epoch\":0,\"rank\":0,\"shard\":")) {
      ++lines;
      EXPECT_THAT(std::string(l), HasSubstr("\"fields\":{\"cls\":1}"));
    }
  }
  EXPECT_EQ(lines, 15);
  CtlRun status = Ctl(dir, {"status", "small", c});
  EXPECT_EQ(status.code, 0);
  EXPECT_THAT(status.output, HasSubstr("DONE"));
  // A finished job shows what its last epoch consumed, not a reset counter.
  EXPECT_THAT(status.output,
              ::testing::ContainsRegex("rank 0 +15 / 15 +consumed"));
  EXPECT_THAT(status.output, HasSubstr("data servers: " +
                                       cluster.data_servers()[0].grpc_address));
  // The one unit (three shards in one shuffle window) was granted once,
  // completed, and nothing expired or came back.
  EXPECT_THAT(status.output,
              HasSubstr("leases: 1 granted, 1 completed, 0 expired, 0 "
                        "returned"));
  CtlRun list = Ctl(dir, {"job", "list", "--json", c});
  EXPECT_THAT(list.output, HasSubstr("\"name\": \"small\""));

  // status --json is one document: every job and the fleet, the named jobs,
  // or the one job named.
  v1::ListJobsResponse listed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(list.output, &listed).ok());
  CtlRun all = Ctl(dir, {"status", "--json", c});
  ASSERT_EQ(all.code, 0) << all.output;
  v1::ListJobsResponse fleet;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(all.output, &fleet).ok())
      << all.output;
  EXPECT_EQ(fleet.jobs_size(), listed.jobs_size());
  EXPECT_GE(fleet.jobs_size(), 2);
  EXPECT_THAT(fleet.live_data_servers(),
              ::testing::ElementsAre(cluster.data_servers()[0].grpc_address));
  CtlRun two = Ctl(dir, {"status", "--json", "small", "ordered", c});
  ASSERT_EQ(two.code, 0) << two.output;
  v1::ListJobsResponse named;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(two.output, &named).ok())
      << two.output;
  ASSERT_EQ(named.jobs_size(), 2);
  EXPECT_EQ(named.jobs(0).spec().name(), "small");
  EXPECT_EQ(named.jobs(1).spec().name(), "ordered");
  EXPECT_EQ(named.live_data_servers_size(), 0);
  CtlRun single = Ctl(dir, {"status", "--json", "small", c});
  v1::Job job;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(single.output, &job).ok())
      << single.output;
  EXPECT_EQ(job.spec().name(), "small");
}

// Two datasets indexed into manifests and mixed by weight: the job's
// description, every sample's source, and status per source.
TEST(SluicectlTest, JobCreateMixesSourcesByWeight) {
  TempDir dir;
  TestCluster cluster(dir.path());
  for (const std::string name : {"web", "books"}) {
    const std::string dataset = cluster.shards_dir() + "/" + name;
    mkdir(dataset.c_str(), 0755);
    for (int s = 0; s < 2; ++s) {
      cluster.WriteShard(absl::StrCat(name, "/", s), 10,
                         [&](testing::TarWriter& tar, int i) {
                           tar.File(absl::StrCat(name, s, "_", i, ".cls"), "1");
                         });
    }
    CtlRun index = Ctl(dir, {"index", dataset, "-o", dir.File(name + ".json")});
    ASSERT_EQ(index.code, 0) << index.output;
  }
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartDataServers(1).ok());
  const std::string c = "--coordinator=" + cluster.coordinator().grpc_address;
  CtlRun empty = Ctl(dir, {"status", c});
  EXPECT_EQ(empty.code, 0);
  EXPECT_THAT(empty.output, HasSubstr("no jobs; data servers: "));
  CtlRun create =
      Ctl(dir, {"job", "create", "--name=mix", "--source",
                "name=web,manifest=" + dir.File("web.json") + ",weight=3",
                "--source=name=books,manifest=" + dir.File("books.json") +
                    ",weight=1,on_exhausted=repeat",
                "--samples_per_epoch=60", "--world_size=1", "--epochs=1", c});
  ASSERT_EQ(create.code, 0) << create.output;
  EXPECT_THAT(create.output,
              HasSubstr("sources: web x3, books x1 per epoch of 60"));
  CtlRun read = Ctl(dir, {"read", "--job=mix", "--rank=0", c});
  ASSERT_EQ(read.code, 0) << read.output;
  std::map<std::string, int> per_source;
  for (absl::string_view l : absl::StrSplit(read.output, '\n')) {
    for (const char* name : {"web", "books"}) {
      if (absl::StrContains(l, absl::StrCat("\"source\":\"", name, "\""))) {
        ++per_source[name];
      }
    }
  }
  EXPECT_EQ(per_source["web"], 45);    // 3/4 of 60
  EXPECT_EQ(per_source["books"], 15);  // its 20 samples: part of a pass
  CtlRun status = Ctl(dir, {"status", "mix", c});
  EXPECT_THAT(status.output,
              ::testing::ContainsRegex("source web +45 / 45 +consumed"));
  EXPECT_THAT(status.output,
              ::testing::ContainsRegex("source books +15 / 15 +consumed"));
  // A malformed --source is a usage error naming it; --source elsewhere too.
  CtlRun bad = Ctl(dir, {"job", "create", "--name=bad", "--source",
                         "name=web,weight=1,colour=red", c});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.output, HasSubstr("unknown key \"colour\""));
  CtlRun misplaced = Ctl(dir, {"status", "--source=name=x", c});
  EXPECT_EQ(misplaced.code, 2);
  EXPECT_THAT(misplaced.output, HasSubstr("--source applies to `job create`"));
  CtlRun negative =
      Ctl(dir, {"job", "create", "--name=neg", "--source",
                "name=web,manifest=" + dir.File("web.json") + ",weight=-1",
                "--samples_per_epoch=10", c});
  EXPECT_EQ(negative.code, 1);
  EXPECT_THAT(negative.output, HasSubstr("spec.sources[0].weight"));
}

TEST(SluicectlTest, UpHaKeepsServingWhenTheLeadingCoordinatorDies) {
  TempDir dir;
  mkdir(dir.File("shards").c_str(), 0755);
  for (int s = 0; s < 3; ++s) {
    testing::TarWriter tar;
    for (int i = 0; i < 5; ++i) tar.File(absl::StrCat("k", s, i, ".cls"), "1");
    testing::WriteFile(dir.File(absl::StrCat("shards/", s, ".tar")),
                       tar.Finish());
  }
  ASSERT_EQ(
      Ctl(dir, {"index", dir.File("shards"), "-o", dir.File("m.json")}).code,
      0);
  const std::string log = dir.File("up.log");
  auto up = ChildProcess::Start(
      {testing::BinDir() + "/sluicectl", "up", "--ha",
       "--dir=" + dir.File("up"), "--shards=" + dir.File("shards"),
       "--data_servers=1", "--coordinator=127.0.0.1:0"},
      log);
  ASSERT_TRUE(up.ok());
  // "coordinator ADDR (pid N, leading; ...)" and "clients: --coordinator=..."
  int leader_pid = 0;
  std::string clients;
  for (const absl::Time end = absl::Now() + absl::Seconds(60);
       absl::Now() < end && clients.empty();
       absl::SleepFor(absl::Milliseconds(50))) {  // polls up's output
    const std::string text = testing::ReadWholeFile(log).value_or("");
    for (absl::string_view l : absl::StrSplit(text, '\n')) {
      const size_t pid_at = l.find("(pid ");
      if (pid_at != absl::string_view::npos &&
          absl::StrContains(l, "leading")) {
        leader_pid = std::atoi(std::string(l.substr(pid_at + 5)).c_str());
      }
      if (absl::ConsumePrefix(&l, "clients: --coordinator=")) {
        clients = std::string(l);
      }
    }
    ASSERT_TRUE(up->running()) << text;
  }
  ASSERT_FALSE(clients.empty()) << testing::ReadWholeFile(log).value_or("");
  ASSERT_GT(leader_pid, 0);
  const std::string c = "--coordinator=" + clients;
  CtlRun create = Ctl(
      dir, {"job", "create", "--name=ha", "--manifest=" + dir.File("m.json"),
            "--world_size=1", "--epochs=1", c});
  ASSERT_EQ(create.code, 0) << create.output;
  const std::vector<std::string> addresses = absl::StrSplit(clients, ',');
  ASSERT_EQ(addresses.size(), 2u);
  CtlRun before = Ctl(dir, {"status", c});
  ASSERT_EQ(before.code, 0) << before.output;
  EXPECT_THAT(before.output,
              ::testing::ContainsRegex(addresses[0] + " +leader"));
  EXPECT_THAT(before.output,
              ::testing::ContainsRegex(absl::StrCat(
                  addresses[1], " +standby \\(leader: ", addresses[0], "\\)")));
  kill(leader_pid, SIGKILL);
  // The standby takes over with the job; the data server re-registers.
  CtlRun read = Ctl(dir, {"read", "--job=ha", "--rank=0", c});
  ASSERT_EQ(read.code, 0) << read.output;
  int lines = 0;
  for (absl::string_view l : absl::StrSplit(read.output, '\n')) {
    lines += absl::StartsWith(l, "{\"epoch\":0,\"rank\":0,\"shard\":");
  }
  EXPECT_EQ(lines, 15);
  CtlRun after = Ctl(dir, {"status", c});
  ASSERT_EQ(after.code, 0) << after.output;
  EXPECT_THAT(after.output,
              ::testing::ContainsRegex(addresses[0] + " +unreachable"));
  EXPECT_THAT(after.output,
              ::testing::ContainsRegex(addresses[1] + " +leader"));
  up->Signal(SIGTERM);
  auto code = up->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << testing::ReadWholeFile(log).value_or("");
  EXPECT_THAT(testing::ReadWholeFile(log).value_or(""),
              HasSubstr("takes over"));
}

// `up --listen_host=0.0.0.0` binds every server to all interfaces: the
// data servers register under this machine's host name, and a client given
// the printed "other nodes" address reads through it.
TEST(SluicectlTest, UpOnAllInterfacesServesOtherNodes) {
  TempDir dir;
  mkdir(dir.File("shards").c_str(), 0755);
  testing::TarWriter tar;
  for (int i = 0; i < 7; ++i) tar.File(absl::StrCat("k", i, ".cls"), "1");
  testing::WriteFile(dir.File("shards/0.tar"), tar.Finish());
  ASSERT_EQ(
      Ctl(dir, {"index", dir.File("shards"), "-o", dir.File("m.json")}).code,
      0);
  const std::string log = dir.File("up.log");
  auto up = ChildProcess::Start(
      {testing::BinDir() + "/sluicectl", "up", "--dir=" + dir.File("up"),
       "--shards=" + dir.File("shards"), "--data_servers=1",
       "--coordinator=127.0.0.1:0", "--listen_host=0.0.0.0"},
      log);
  ASSERT_TRUE(up.ok());
  std::string other;
  for (const absl::Time end = absl::Now() + absl::Seconds(60);
       absl::Now() < end && other.empty();
       absl::SleepFor(absl::Milliseconds(50))) {  // polls up's output
    const std::string text = testing::ReadWholeFile(log).value_or("");
    for (absl::string_view l : absl::StrSplit(text, '\n')) {
      if (absl::ConsumePrefix(&l, "other nodes: --coordinator="))
        other = std::string(l);
    }
    ASSERT_TRUE(up->running()) << text;
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  ASSERT_TRUE(absl::StartsWith(other, absl::StrCat(host, ":")))
      << testing::ReadWholeFile(log).value_or("");
  EXPECT_THAT(
      testing::ReadWholeFile(dir.File("up/logs/dataserver-0.log")).value_or(""),
      ::testing::AllOf(HasSubstr("listening on 0.0.0.0:"),
                       HasSubstr(absl::StrCat(" as ", host, ":"))));
  const std::string c = "--coordinator=" + other;
  CtlRun create = Ctl(dir, {"job", "create", "--name=wide",
                            "--manifest=" + dir.File("m.json"), c});
  ASSERT_EQ(create.code, 0) << create.output;
  CtlRun read = Ctl(dir, {"read", "--job=wide", "--rank=0", c});
  ASSERT_EQ(read.code, 0) << read.output;
  int lines = 0;
  for (absl::string_view l : absl::StrSplit(read.output, '\n'))
    lines += absl::StartsWith(l, "{\"epoch\":0,");
  EXPECT_EQ(lines, 7);
  up->Signal(SIGTERM);
  auto code = up->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

// `up` with TLS flags for both servers and client credentials for itself: a
// cluster that takes only mutually authenticated TLS comes up (its
// readiness and registration checks speak TLS), and a job is created and
// read over it.
TEST(SluicectlTest, UpServesOverMutualTls) {
  TempDir dir;
  auto pki = testing::MakeTestPki(dir.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  mkdir(dir.File("shards").c_str(), 0755);
  testing::TarWriter tar;
  for (int i = 0; i < 5; ++i) tar.File(absl::StrCat("k", i, ".cls"), "1");
  testing::WriteFile(dir.File("shards/0.tar"), tar.Finish());
  ASSERT_EQ(
      Ctl(dir, {"index", dir.File("shards"), "-o", dir.File("m.json")}).code,
      0);
  const std::string server_tls = absl::StrCat(
      "--tls_cert=", pki->server_cert, ",--tls_key=", pki->server_key,
      ",--tls_client_ca=", pki->ca_cert);
  const std::vector<std::string> client_tls = {
      "--ca_cert=" + pki->ca_cert, "--client_cert=" + pki->client_cert,
      "--client_key=" + pki->client_key};
  std::vector<std::string> argv = {
      testing::BinDir() + "/sluicectl",
      "up",
      "--dir=" + dir.File("up"),
      "--shards=" + dir.File("shards"),
      "--data_servers=1",
      "--coordinator=127.0.0.1:0",
      absl::StrCat("--data_server_flags=", server_tls, ",--coordinator_ca=",
                   pki->ca_cert, ",--coordinator_cert=", pki->client_cert,
                   ",--coordinator_key=", pki->client_key)};
  argv.insert(argv.end(), client_tls.begin(), client_tls.end());
  argv.push_back("--");
  for (absl::string_view flag : absl::StrSplit(server_tls, ','))
    argv.emplace_back(flag);
  argv.push_back("--admin_identities=client");  // the client certificate's CN
  const std::string log = dir.File("up.log");
  auto up = ChildProcess::Start(argv, log);
  ASSERT_TRUE(up.ok());
  std::string address;
  for (const absl::Time end = absl::Now() + absl::Seconds(90);
       absl::Now() < end && address.empty();
       absl::SleepFor(absl::Milliseconds(50))) {  // polls up's output
    const std::string text = testing::ReadWholeFile(log).value_or("");
    for (absl::string_view l : absl::StrSplit(text, '\n')) {
      if (absl::ConsumePrefix(&l, "coordinator "))
        address = std::string(l.substr(0, l.find(' ')));
    }
    ASSERT_TRUE(up->running()) << text;
  }
  ASSERT_FALSE(address.empty()) << testing::ReadWholeFile(log).value_or("");
  std::vector<std::string> create = {"job", "create", "--name=secure",
                                     "--manifest=" + dir.File("m.json"),
                                     "--coordinator=" + address};
  create.insert(create.end(), client_tls.begin(), client_tls.end());
  CtlRun created = Ctl(dir, create);
  ASSERT_EQ(created.code, 0) << created.output;
  std::vector<std::string> read = {"read", "--job=secure", "--rank=0",
                                   "--coordinator=" + address};
  read.insert(read.end(), client_tls.begin(), client_tls.end());
  CtlRun got = Ctl(dir, read);
  ASSERT_EQ(got.code, 0) << got.output;
  int lines = 0;
  for (absl::string_view l : absl::StrSplit(got.output, '\n'))
    lines += absl::StartsWith(l, "{\"epoch\":0,");
  EXPECT_EQ(lines, 5);
  // Without credentials the same cluster refuses the client.
  CtlRun plain = Ctl(
      dir, {"read", "--job=secure", "--rank=0", "--coordinator=" + address});
  EXPECT_NE(plain.code, 0);
  up->Signal(SIGTERM);
  auto code = up->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

// `read` lines are JSON whatever bytes a shard's names hold: a key that is
// not UTF-8 (a Latin-1 name) comes out with U+FFFD in its place, and a
// quote or backslash escaped.
TEST(SluicectlTest, ReadLinesAreJsonForAnyKey) {
  TempDir dir;
  TestCluster cluster(dir.path());
  const std::string shard =
      cluster.WriteShard("0", 2, [](testing::TarWriter& tar, int i) {
        if (i == 0) tar.File("caf\xe9.cls", "1");
        if (i == 1) tar.File("say \"hi\"\\.cls", "2");
      });
  testing::WriteFile(dir.File("m.json"),
                     absl::StrCat(R"({"shards": [{"url": ")", shard,
                                  R"(", "num_samples": 2}]})"));
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartDataServers(1).ok());
  const std::string c = "--coordinator=" + cluster.coordinator().grpc_address;
  ASSERT_EQ(Ctl(dir, {"job", "create", "--name=keys",
                      "--manifest=" + dir.File("m.json"), "--noshuffle", c})
                .code,
            0);
  CtlRun read = Ctl(dir, {"read", "--job=keys", c});
  ASSERT_EQ(read.code, 0) << read.output;
  EXPECT_THAT(read.output, HasSubstr("\"key\":\"caf\xef\xbf\xbd\""));
  EXPECT_THAT(read.output, HasSubstr("\"key\":\"say \\\"hi\\\"\\\\\""));
}

TEST(SluicectlTest, HealthWaitReturnsOnceTheServerIsReady) {
  TempDir dir;
  const int port = ReserveLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  // Without --wait, a server that is not there yet is an error at once.
  CtlRun now = Ctl(dir, {"health", address, "--timeout=2s"});
  EXPECT_EQ(now.code, 3) << now.output;
  // With --wait, sluicectl keeps asking until the coordinator started later
  // on that port is ready.
  const std::string log = dir.File("wait.log");
  auto waiting =
      ChildProcess::Start({testing::BinDir() + "/sluicectl", "health", address,
                           "--service=readiness", "--wait", "--timeout=60s"},
                          log);
  ASSERT_TRUE(waiting.ok());
  auto coordinator = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {absl::StrCat("--listen=", address), "--journal_dir=" + dir.File("j")});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto code = waiting->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  EXPECT_THAT(testing::ReadWholeFile(log).value_or(""),
              HasSubstr(address + " SERVING"));
}

TEST(SluicectlTest, ErrorPathsHaveClearMessagesAndExitCodes) {
  TempDir dir;
  CtlRun unreachable =
      Ctl(dir, {"job", "list", "--coordinator=127.0.0.1:1", "--timeout=3s"});
  EXPECT_EQ(unreachable.code, 3) << unreachable.output;
  EXPECT_THAT(unreachable.output, HasSubstr("127.0.0.1:1 unreachable"));
  EXPECT_LT(unreachable.took, absl::Seconds(10));
  CtlRun read_unreachable = Ctl(
      dir, {"read", "--job=x", "--coordinator=127.0.0.1:1", "--timeout=2s"});
  EXPECT_EQ(read_unreachable.code, 3) << read_unreachable.output;
  EXPECT_THAT(read_unreachable.output,
              HasSubstr("127.0.0.1:1 unreachable for 2s (--timeout)"));
  EXPECT_LT(read_unreachable.took, absl::Seconds(10));

  TestCluster cluster(dir.path());
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  const std::string c = "--coordinator=" + cluster.coordinator().grpc_address;
  CtlRun unknown = Ctl(dir, {"job", "get", "nope", c});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_THAT(unknown.output, HasSubstr("nope"));
  EXPECT_THAT(unknown.output, HasSubstr("NOT_FOUND"));

  testing::WriteFile(dir.File("bad.json"), "{\"shards\": [{\"url\": 3");
  CtlRun bad = Ctl(dir, {"job", "create", "--name=x",
                         "--manifest=" + dir.File("bad.json"), c});
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.output, HasSubstr("--manifest"));
  testing::WriteFile(dir.File("empty.json"), "{\"shards\": []}");
  CtlRun empty = Ctl(dir, {"job", "create", "--name=x",
                           "--manifest=" + dir.File("empty.json"), c});
  EXPECT_EQ(empty.code, 1);
  EXPECT_THAT(empty.output, HasSubstr("INVALID_ARGUMENT"));

  CtlRun usage = Ctl(dir, {"job", "create", "--manifest=m.json", c});
  EXPECT_EQ(usage.code, 2);
  EXPECT_THAT(usage.output, HasSubstr("--name is required"));
  // `up` on a port in use says why the coordinator could not start.
  CtlRun busy =
      Ctl(dir, {"up", "--dir=" + dir.File("up"), "--data_servers=0",
                "--coordinator=" + cluster.coordinator().grpc_address});
  EXPECT_EQ(busy.code, 1);
  EXPECT_THAT(busy.output, HasSubstr("cannot listen on --listen="));
  CtlRun unknown_command = Ctl(dir, {"frobnicate"});
  EXPECT_EQ(unknown_command.code, 2);
  EXPECT_THAT(unknown_command.output, Not(HasSubstr("did you mean")));
  // A typo gets the nearest command or flag as a suggestion.
  CtlRun typo = Ctl(dir, {"stauts", c});
  EXPECT_EQ(typo.code, 2);
  EXPECT_THAT(typo.output, HasSubstr("(did you mean status?)"));
  CtlRun flag_typo = Ctl(dir, {"job", "create", "--nmae=x", c});
  EXPECT_EQ(flag_typo.code, 2);
  EXPECT_THAT(flag_typo.output, HasSubstr("(did you mean --name?)"));
  CtlRun help = Ctl(dir, {"job", "--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.output, HasSubstr("Exit codes"));
  EXPECT_THAT(help.output, HasSubstr("sluicectl job create --name N"));
  EXPECT_THAT(help.output, HasSubstr("--world_size"));
  CtlRun full = Ctl(dir, {"--helpfull"});
  EXPECT_THAT(full.output, HasSubstr("Flags from client/cli/common.cc"));
  EXPECT_THAT(full.output, Not(HasSubstr("Flags from /")));  // no build paths
  CtlRun up_help = Ctl(dir, {"up", "--help"});
  EXPECT_EQ(up_help.code, 0);
  EXPECT_THAT(up_help.output, HasSubstr("--data_servers"));
  EXPECT_THAT(up_help.output, Not(HasSubstr("Commands:")));
  // A flag of another command, or none at all, is a usage error (exit 2)
  // naming the flag; nothing runs.
  CtlRun foreign = Ctl(dir, {"status", "--world_size=4", c});
  EXPECT_EQ(foreign.code, 2);
  EXPECT_THAT(foreign.output,
              HasSubstr("--world_size does not apply to `status`"));
  CtlRun list_epochs = Ctl(dir, {"job", "list", "--epochs=9", c});
  EXPECT_EQ(list_epochs.code, 2);
  EXPECT_THAT(list_epochs.output,
              HasSubstr("--epochs does not apply to `job list`"));
  CtlRun read_epochs = Ctl(dir, {"read", "--job=x", "--epochs=1", c});
  EXPECT_EQ(read_epochs.code, 2);
  EXPECT_THAT(read_epochs.output, HasSubstr("read --help"));
  CtlRun bogus = Ctl(dir, {"status", "--bogus", c});
  EXPECT_EQ(bogus.code, 2);
  EXPECT_THAT(bogus.output, HasSubstr("unknown flag --bogus"));
}

}  // namespace
}  // namespace sluice
