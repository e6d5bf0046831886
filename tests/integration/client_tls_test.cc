// The C++ client's TLS options (sluice/tls.h) against servers that take
// only mutually authenticated TLS: a Reader reads an epoch from a TLS data
// server, and RunOnce / WaitBarrier coordinate, all with PEM from
// ReadClientTls.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sluice/coordination.h"
#include "sluice/reader.h"
#include "sluice/tls.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tls_fixture.h"

namespace sluice {
namespace {

using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;

TEST(ClientTlsTest, ReaderOnceAndBarrierOverMutualTls) {
  TempDir dir;
  auto pki = testing::MakeTestPki(dir.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  mkdir(dir.File("shards").c_str(), 0755);
  testing::TarWriter tar;
  for (int i = 0; i < 7; ++i) {
    tar.File(absl::StrCat("s", i, ".cls"), absl::StrCat(i));
  }
  testing::WriteFile(dir.File("shards/a.tar"), tar.Finish());
  testing::WriteFile(
      dir.File("manifest.json"),
      absl::StrCat(R"({"shards": [{"url": ")", dir.File("shards/a.tar"),
                   R"(", "num_samples": 7}]})"));
  const std::vector<std::string> server_tls = {
      "--tls_cert=" + pki->server_cert, "--tls_key=" + pki->server_key,
      "--tls_client_ca=" + pki->ca_cert};
  std::vector<std::string> coordinator_args = {
      "--journal_dir=" + dir.File("journal"), "--heartbeat_interval=200ms",
      "--admin_identities=client"};  // the client certificate's CN
  coordinator_args.insert(coordinator_args.end(), server_tls.begin(),
                          server_tls.end());
  auto coordinator =
      testing::StartServer("sluice-coordinator", dir.path(), coordinator_args);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<std::string> data_args = {
      "--roots=" + dir.File("shards"),
      "--coordinator=" + coordinator->grpc_address,
      "--coordinator_ca=" + pki->ca_cert,
      "--coordinator_cert=" + pki->client_cert,
      "--coordinator_key=" + pki->client_key};
  data_args.insert(data_args.end(), server_tls.begin(), server_tls.end());
  mkdir(dir.File("data").c_str(), 0755);
  auto data =
      testing::StartServer("sluice-dataserver", dir.File("data"), data_args);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(testing::WaitForMetric(coordinator->metrics_address,
                                     "sluice_coordinator_data_servers 1"));
  auto create = testing::ChildProcess::Start(
      {testing::BinDir() + "/sluicectl", "job", "create", "--name=tls",
       "--manifest=" + dir.File("manifest.json"), "--world_size=1",
       "--coordinator=" + coordinator->grpc_address,
       "--ca_cert=" + pki->ca_cert, "--client_cert=" + pki->client_cert,
       "--client_key=" + pki->client_key},
      dir.File("create.log"));
  ASSERT_TRUE(create.ok());
  auto created = create->Wait(absl::Seconds(30));
  ASSERT_TRUE(created.ok() && *created == 0)
      << testing::ReadWholeFile(dir.File("create.log")).value_or("");

  auto tls = ReadClientTls(pki->ca_cert, pki->client_cert, pki->client_key);
  ASSERT_TRUE(tls.ok()) << tls.status();
  ReaderOptions options;
  options.coordinator = coordinator->grpc_address;
  options.job = "tls";
  options.tls = *tls;
  auto reader = Reader::Create(options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> keys;
  while (true) {
    auto e = (*reader)->Next();
    ASSERT_TRUE(e.ok()) << e.status();
    if (e->kind == ReaderEvent::Kind::kDone) break;
    if (e->kind == ReaderEvent::Kind::kSample) {
      EXPECT_EQ(e->sample.data_server, data->grpc_address);
      keys.push_back(e->sample.key);
    }
  }
  EXPECT_THAT(keys,
              ::testing::ElementsAre("s0", "s1", "s2", "s3", "s4", "s5", "s6"));
  (*reader)->Close();

  OnceOptions once;
  once.coordinator = coordinator->grpc_address;
  once.name = "prepare";
  once.tls = *tls;
  auto outcome = RunOnce(once, []() -> absl::StatusOr<std::string> {
    return std::string("done");
  });
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->ran);
  EXPECT_EQ(outcome->result, "done");

  BarrierOptions barrier;
  barrier.coordinator = coordinator->grpc_address;
  barrier.name = "ckpt";
  barrier.participant = "rank-0";
  barrier.participants = 1;
  barrier.tls = *tls;
  auto arrived = WaitBarrier(barrier);
  ASSERT_TRUE(arrived.ok()) << arrived.status();
  EXPECT_THAT(arrived->arrived(), ::testing::ElementsAre("rank-0"));
}

}  // namespace
}  // namespace sluice
