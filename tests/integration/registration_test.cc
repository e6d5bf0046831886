// Data servers register with the coordinator, leases name them and carry a
// token they accept, and registration survives a coordinator SIGKILL.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "sluice/v1/dataserver.grpc.pb.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tls_fixture.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::sluice::testing::WaitForMetric;
using ::testing::HasSubstr;

// An 8-sample shard under dir/shards and a lease secret in dir/secret; a
// coordinator (journal in dir/journal) and a data server registered with it,
// both with the secret.
struct SecretCluster {
  std::string shard;
  std::string secret_flag;
  std::string journal_flag;
  std::optional<ServerProcess> coordinator;
  std::optional<ServerProcess> dataserver;
};

void StartSecretCluster(const TempDir& dir, SecretCluster* c) {
  mkdir(dir.File("shards").c_str(), 0755);
  testing::TarWriter tar;
  for (int i = 0; i < 8; ++i)
    tar.File(absl::StrCat("k", i, ".cls"), std::to_string(i));
  c->shard = dir.File("shards/a.tar");
  testing::WriteFile(c->shard, tar.Finish());
  testing::WriteFile(dir.File("secret"), "a shared secret\n");
  c->secret_flag = "--lease_secret_file=" + dir.File("secret");
  c->journal_flag = "--journal_dir=" + dir.File("journal");
  auto coordinator = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {c->journal_flag, c->secret_flag, "--heartbeat_interval=200ms",
       "--allow_unauthenticated_admin"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  c->coordinator.emplace(*std::move(coordinator));
  auto dataserver =
      testing::StartServer("sluice-dataserver", dir.path(),
                           {"--roots=" + dir.File("shards"), c->secret_flag,
                            "--coordinator=" + c->coordinator->grpc_address});
  ASSERT_TRUE(dataserver.ok()) << dataserver.status();
  c->dataserver.emplace(*std::move(dataserver));
  ASSERT_TRUE(WaitForMetric(c->coordinator->metrics_address,
                            "sluice_coordinator_data_servers 1"));
}

// One epoch of the cluster's shard for one rank.
v1::JobSpec ShardJob(const std::string& name, const SecretCluster& c) {
  v1::JobSpec spec;
  spec.set_name(name);
  auto* s = spec.mutable_manifest()->add_shards();
  s->set_url(c.shard);
  s->set_num_samples(8);
  spec.set_world_size(1);
  spec.set_num_epochs(1);
  return spec;
}

// ReadSamples of `lease` to the end; counts the samples.
grpc::Status ReadLease(v1::DataServer::Stub& data, const v1::Lease& lease,
                       int* samples) {
  grpc::ClientContext ctx;
  v1::ReadRequest request;
  *request.mutable_lease() = lease;
  auto reader = data.ReadSamples(&ctx, request);
  v1::SampleBatch batch;
  *samples = 0;
  while (reader->Read(&batch)) *samples += batch.samples_size();
  return reader->Finish();
}

// Grants `job`'s first unit to trainer t0 and reads it; then, t0's session
// gone and its lease expired, grants the unit again to t1 and reads that, so
// the data server has seen the unit's newer fence. Returns that lease.
void ReadAUnitTwice(const std::string& coordinator, const std::string& job,
                    v1::DataServer::Stub& data, v1::Lease* newest) {
  int samples = 0;
  auto first = testing::FirstGrant(coordinator, job, "t0");
  ASSERT_TRUE(first.ok()) << first.status();
  grpc::Status status = ReadLease(data, *first, &samples);
  ASSERT_TRUE(status.ok()) << status.error_message();
  auto again = testing::FirstGrant(coordinator, job, "t1");
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->unit().sequence(), first->unit().sequence());
  ASSERT_GT(again->fence(), first->fence());
  status = ReadLease(data, *again, &samples);
  ASSERT_TRUE(status.ok()) << status.error_message();
  *newest = *again;
}

TEST(RegistrationTest, LeasesNameALiveDataServerAndSurviveACoordinatorRestart) {
  TempDir dir;
  SecretCluster c;
  ASSERT_NO_FATAL_FAILURE(StartSecretCluster(dir, &c));
  auto& coordinator = c.coordinator;
  auto& dataserver = c.dataserver;
  const std::string& secret_flag = c.secret_flag;
  const std::string& journal = c.journal_flag;

  ASSERT_TRUE(
      testing::CreateJob(coordinator->grpc_address, ShardJob("reg", c)).ok());
  auto granted = testing::FirstGrant(coordinator->grpc_address, "reg", "t0");
  ASSERT_TRUE(granted.ok()) << granted.status();
  const v1::Lease lease = *granted;
  EXPECT_EQ(lease.data_server(), dataserver->grpc_address);
  EXPECT_EQ(lease.token().size(), 32u);

  // The data server accepts the coordinator's token, and refuses a forgery.
  auto data = v1::DataServer::NewStub(grpc::CreateChannel(
      lease.data_server(), grpc::InsecureChannelCredentials()));
  auto read = [&](const v1::Lease& l, int* samples) {
    return ReadLease(*data, l, samples);
  };
  int samples = 0;
  grpc::Status ok = read(lease, &samples);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(samples, lease.unit().end() - lease.unit().begin());
  v1::Lease forged = lease;
  forged.mutable_unit()->set_end(forged.unit().end() + 1);
  EXPECT_EQ(read(forged, &samples).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // SIGKILL the coordinator and restart it on the same port and journal: the
  // data server registers again by itself.
  const std::string address = coordinator->grpc_address;
  coordinator->process.Kill();
  auto restarted = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {journal, secret_flag, "--heartbeat_interval=200ms",
       "--listen=" + address, "--allow_unauthenticated_admin"});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(WaitForMetric(restarted->metrics_address,
                            "sluice_coordinator_data_servers 1"));
  // The coordinator counts the server before the server has read the reply
  // and logged it: poll the log.
  EXPECT_TRUE(testing::WaitForFileText(dataserver->log_path,
                                       "re-registered with coordinator",
                                       absl::Seconds(20)))
      << testing::ReadWholeFile(dataserver->log_path).value_or("");

  // A data server that stops is dropped from routing.
  dataserver->process.Signal(SIGTERM);
  auto code = dataserver->process.Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  EXPECT_TRUE(WaitForMetric(restarted->metrics_address,
                            "sluice_coordinator_data_servers 0"));
}

// A training job run again under the same name (deleted, created again):
// data servers refuse a fence older than one they have seen for the same
// unit, so the rerun's fences must lie above every fence of the old run,
// or its leases are refused as stale until the data servers restart.
// A coordinator down for longer than a few retries (a node restart): once it
// is back, the data server registers again within about a heartbeat
// interval (1 s), not after a backoff grown over the outage (it took up to
// 17.5 s while no unit could be granted). The bound is 3 s for a loaded
// machine.
TEST(RegistrationTest,
     DataServersRegisterAgainSoonAfterALongCoordinatorOutage) {
  TempDir dir;
  SecretCluster c;
  ASSERT_NO_FATAL_FAILURE(StartSecretCluster(dir, &c));
  const std::string address = c.coordinator->grpc_address;
  c.coordinator->process.Kill();
  absl::SleepFor(
      absl::Seconds(8));  // the outage itself, not a wait for an event
  auto restarted = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {c.journal_flag, c.secret_flag, "--heartbeat_interval=200ms",
       "--listen=" + address, "--allow_unauthenticated_admin"});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  const absl::Time listening = absl::Now();
  ASSERT_TRUE(WaitForMetric(restarted->metrics_address,
                            "sluice_coordinator_data_servers 1"));
  const absl::Duration took = absl::Now() - listening;
  EXPECT_LT(took, absl::Seconds(3))
      << "registered again " << took << " after the restart";
  std::printf("registered again %s after the restart\n",
              absl::FormatDuration(took).c_str());
}

TEST(RegistrationTest, AJobCreatedAgainUnderItsNameIsServed) {
  TempDir dir;
  SecretCluster c;
  ASSERT_NO_FATAL_FAILURE(StartSecretCluster(dir, &c));
  auto& coordinator = c.coordinator;
  v1::JobSpec spec = ShardJob("rerun", c);
  spec.set_lease_ttl_ms(500);
  auto data = v1::DataServer::NewStub(grpc::CreateChannel(
      c.dataserver->grpc_address, grpc::InsecureChannelCredentials()));
  int samples = 0;
  auto read = [&](const v1::Lease& l) { return ReadLease(*data, l, &samples); };

  ASSERT_TRUE(testing::CreateJob(coordinator->grpc_address, spec).ok());
  v1::Lease again;
  ASSERT_NO_FATAL_FAILURE(
      ReadAUnitTwice(coordinator->grpc_address, "rerun", *data, &again));

  {
    auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
        coordinator->grpc_address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext del;
    v1::DeleteJobRequest request;
    request.set_name("rerun");
    v1::DeleteJobResponse response;
    ASSERT_TRUE(stub->DeleteJob(&del, request, &response).ok());
  }
  ASSERT_TRUE(testing::CreateJob(coordinator->grpc_address, spec).ok());
  auto rerun = testing::FirstGrant(coordinator->grpc_address, "rerun", "t2");
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_EQ(rerun->unit().sequence(), again.unit().sequence());
  EXPECT_GT(rerun->fence(), again.fence());
  grpc::Status status = read(*rerun);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// A coordinator restarted on an empty journal (its volume lost) would grant
// fences from 1 again; the data servers report the newest fence they saw
// when they register again, and the coordinator grants above it.
TEST(RegistrationTest,
     ACoordinatorThatLostItsJournalGrantsAboveWhatDataServersSaw) {
  TempDir dir;
  SecretCluster c;
  ASSERT_NO_FATAL_FAILURE(StartSecretCluster(dir, &c));
  v1::JobSpec spec = ShardJob("lost", c);
  spec.set_lease_ttl_ms(500);
  auto data = v1::DataServer::NewStub(grpc::CreateChannel(
      c.dataserver->grpc_address, grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(testing::CreateJob(c.coordinator->grpc_address, spec).ok());
  v1::Lease again;
  ASSERT_NO_FATAL_FAILURE(
      ReadAUnitTwice(c.coordinator->grpc_address, "lost", *data, &again));

  const std::string address = c.coordinator->grpc_address;
  c.coordinator->process.Kill();
  auto restarted = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {"--journal_dir=" + dir.File("empty-journal"), c.secret_flag,
       "--heartbeat_interval=200ms", "--listen=" + address,
       "--allow_unauthenticated_admin"});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(WaitForMetric(restarted->metrics_address,
                            "sluice_coordinator_data_servers 1"));
  ASSERT_TRUE(testing::CreateJob(address, spec).ok());
  auto granted = testing::FirstGrant(address, "lost", "t2");
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(granted->unit().sequence(), again.unit().sequence());
  EXPECT_GT(granted->fence(), again.fence());
  int samples = 0;
  grpc::Status status = ReadLease(*data, *granted, &samples);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(samples, 8);
}

// A coordinator that takes only mutually authenticated TLS: a data server
// registers with --coordinator_ca/--coordinator_cert/--coordinator_key; one
// without a client certificate is refused and never counted live.
TEST(RegistrationTest, DataServersRegisterOverMutualTls) {
  TempDir dir;
  auto pki = testing::MakeTestPki(dir.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  mkdir(dir.File("shards").c_str(), 0755);
  auto coordinator = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {"--journal_dir=" + dir.File("journal"), "--heartbeat_interval=200ms",
       "--tls_cert=" + pki->server_cert, "--tls_key=" + pki->server_key,
       "--tls_client_ca=" + pki->ca_cert});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  mkdir(dir.File("anonymous").c_str(), 0755);
  auto anonymous =
      testing::StartServer("sluice-dataserver", dir.File("anonymous"),
                           {"--roots=" + dir.File("shards"),
                            "--coordinator=" + coordinator->grpc_address,
                            "--coordinator_ca=" + pki->ca_cert});
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  mkdir(dir.File("trusted").c_str(), 0755);
  auto trusted =
      testing::StartServer("sluice-dataserver", dir.File("trusted"),
                           {"--roots=" + dir.File("shards"),
                            "--coordinator=" + coordinator->grpc_address,
                            "--coordinator_ca=" + pki->ca_cert,
                            "--coordinator_cert=" + pki->client_cert,
                            "--coordinator_key=" + pki->client_key});
  ASSERT_TRUE(trusted.ok()) << trusted.status();
  ASSERT_TRUE(WaitForMetric(coordinator->metrics_address,
                            "sluice_coordinator_data_servers 1"));
  // The anonymous one keeps failing its handshake (and says so).
  ASSERT_TRUE(testing::WaitForFileText(
      anonymous->log_path, "registration stream ended", absl::Seconds(20)));
  auto page =
      testing::HttpGet("http://" + coordinator->metrics_address + "/metrics");
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(page->body, HasSubstr("sluice_coordinator_data_servers 1\n"));

  // sluicectl talks to it with the same CA and a client certificate.
  auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), testing::BinDir() + "/sluicectl");
    auto child = testing::ChildProcess::Start(args, dir.File("ctl.log"));
    EXPECT_TRUE(child.ok());
    auto code = child->Wait(absl::Seconds(30));
    return code.ok() ? *code : -1;
  };
  EXPECT_EQ(
      ctl({"job", "list", "--coordinator=" + coordinator->grpc_address,
           "--ca_cert=" + pki->ca_cert, "--client_cert=" + pki->client_cert,
           "--client_key=" + pki->client_key}),
      0);
  // Plaintext: a configuration error (exit 1) naming TLS, not "unreachable".
  EXPECT_EQ(ctl({"job", "list", "--coordinator=" + coordinator->grpc_address,
                 "--timeout=2s"}),
            1);
  EXPECT_THAT(testing::ReadWholeFile(dir.File("ctl.log")).value_or(""),
              HasSubstr("coordinator " + coordinator->grpc_address +
                        " speaks TLS, but this client connects in plaintext"));
  EXPECT_EQ(
      ctl({"job", "list", "--coordinator=" + coordinator->grpc_address,
           "--ca_cert=" + pki->ca_cert, "--client_cert=" + pki->client_cert}),
      2);
  EXPECT_THAT(testing::ReadWholeFile(dir.File("ctl.log")).value_or(""),
              HasSubstr("--client_key"));

  // Half a client certificate is a flag error naming the flag.
  mkdir(dir.File("bad").c_str(), 0755);
  auto bad = testing::ChildProcess::Start(
      {testing::BinDir() + "/sluice-dataserver",
       "--roots=" + dir.File("shards"), "--listen=127.0.0.1:0",
       "--coordinator=" + coordinator->grpc_address,
       "--coordinator_ca=" + pki->ca_cert,
       "--coordinator_cert=" + pki->client_cert},
      dir.File("bad/log"));
  ASSERT_TRUE(bad.ok());
  auto code = bad->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(testing::ReadWholeFile(dir.File("bad/log")).value_or(""),
              HasSubstr("--coordinator_key"));
}

}  // namespace
}  // namespace sluice
