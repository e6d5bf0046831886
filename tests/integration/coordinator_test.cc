// The real sluice-coordinator binary with scripted trainers over real gRPC.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/common/work_unit.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

// These tests drive scripted trainers that read nothing: grants need not
// wait for a data server.
const char kNoDataServers[] = "--wait_for_data_servers=false";

using ::sluice::testing::ChildProcess;
using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

using Sample = std::pair<int32_t, int64_t>;  // (shard, index)

// What every trainer acknowledged: epoch -> sample -> count, and per-rank
// totals. Thread-safe.
struct Ledger {
  absl::Mutex mu;
  std::map<int64_t, std::map<Sample, int>> acked;
  std::map<int64_t, std::map<int32_t, int64_t>> per_rank;
  void Ack(const v1::Lease& lease) {
    absl::MutexLock lock(&mu);
    for (int64_t k = lease.unit().begin(); k < lease.unit().end(); ++k) {
      ++acked[lease.epoch()][{UnitIndex(lease.unit()), k}];
    }
    per_rank[lease.epoch()][lease.rank()] +=
        lease.unit().end() - lease.unit().begin();
  }
};

std::unique_ptr<v1::Coordinator::Stub> Connect(const std::string& address) {
  return v1::Coordinator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

v1::JobSpec ManifestSpec(const std::string& name, int shards,
                         int32_t world_size, int64_t epochs) {
  v1::JobSpec spec;
  spec.set_name(name);
  for (int i = 0; i < shards; ++i) {
    auto* s = spec.mutable_manifest()->add_shards();
    s->set_url("/data/train-" + std::to_string(i) + ".tar");
    s->set_num_samples(1 + (i * 7) % 13);  // uneven shards, 0 < n <= 13
  }
  spec.set_world_size(world_size);
  spec.set_num_epochs(epochs);
  spec.set_shuffle(true);
  // Units of whole shards (the tests count and kill by unit).
  spec.set_shuffle_window(1);
  spec.set_seed(17);
  return spec;
}

struct RunResult {
  grpc::Status status;
  int epochs_begun = 0;
  int64_t samples_for_rank = -1;
  bool job_done = false;
  int units = 0;
};

// A scripted trainer: Hello, Want(credits), completes every granted lease,
// stops at JobDone or after `max_units` units (then just drops the stream).
RunResult RunTrainer(v1::Coordinator::Stub* stub, const std::string& job,
                     int32_t rank, const std::string& trainer_id,
                     Ledger* ledger, int max_units = -1) {
  RunResult result;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(120));
  auto stream = stub->Session(&ctx);
  v1::TrainerMessage hello;
  hello.mutable_hello()->set_job(job);
  hello.mutable_hello()->set_rank(rank);
  hello.mutable_hello()->set_trainer_id(trainer_id);
  stream->Write(hello);
  v1::TrainerMessage want;
  want.mutable_want()->set_credits(4);
  stream->Write(want);
  v1::CoordinatorMessage m;
  while (stream->Read(&m)) {
    if (m.has_epoch_begin()) {
      ++result.epochs_begun;
      result.samples_for_rank = m.epoch_begin().samples_for_rank();
    } else if (m.has_grant()) {
      if (max_units >= 0 && result.units >= max_units) {
        // Before dying, wait until every Complete sent so far is durable
        // (Sync answers once the messages before it are); the leases still
        // held then die unreported. Grants arriving meanwhile die too.
        v1::TrainerMessage sync;
        sync.mutable_sync()->set_id(1);
        stream->Write(sync);
        v1::CoordinatorMessage reply;
        while (stream->Read(&reply) &&
               !(reply.has_synced() && reply.synced().id() == 1)) {
        }
        ctx.TryCancel();
        break;
      }
      ledger->Ack(m.grant().lease());
      v1::TrainerMessage complete;
      complete.mutable_complete()->mutable_lease()->set_lease_id(
          m.grant().lease().lease_id());
      complete.mutable_complete()->mutable_lease()->set_fence(
          m.grant().lease().fence());
      stream->Write(complete);
      ++result.units;
    } else if (m.has_job_done()) {
      result.job_done = true;
      stream->WritesDone();
    }
  }
  result.status = stream->Finish();
  return result;
}

// (a) 8 sessions consume 3 epochs of a 1,000-shard manifest: every sample
// exactly once per epoch, equal counts per rank.
TEST(CoordinatorIntegrationTest, EightRanksThreeEpochsExactlyOnceAndBalanced) {
  TempDir dir;
  auto server =
      testing::StartServer("sluice-coordinator", dir.path(), {kNoDataServers});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Connect(server->grpc_address);
  v1::CreateJobRequest req;
  *req.mutable_spec() = ManifestSpec("big", 1000, 8, 3);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub->CreateJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const int64_t total = job.status().total_samples();
  const int64_t quota = total / 8;
  ASSERT_EQ(job.status().samples_per_rank(), quota);

  Ledger ledger;
  std::vector<RunResult> results(8);
  std::vector<std::thread> trainers;
  for (int r = 0; r < 8; ++r) {
    trainers.emplace_back([&, r] {
      results[r] = RunTrainer(stub.get(), "big", r,
                              "trainer-" + std::to_string(r), &ledger);
    });
  }
  for (auto& t : trainers) t.join();
  for (int r = 0; r < 8; ++r) {
    EXPECT_TRUE(results[r].status.ok())
        << r << ": " << results[r].status.error_message();
    EXPECT_TRUE(results[r].job_done);
    EXPECT_EQ(results[r].epochs_begun, 3);
    EXPECT_EQ(results[r].samples_for_rank, quota);
  }
  ASSERT_EQ(ledger.acked.size(), 3u);
  for (const auto& [epoch, samples] : ledger.acked) {
    EXPECT_EQ(static_cast<int64_t>(samples.size()), quota * 8)
        << "epoch " << epoch;
    for (const auto& [sample, n] : samples)
      ASSERT_EQ(n, 1) << "epoch " << epoch;
    for (int r = 0; r < 8; ++r) EXPECT_EQ(ledger.per_rank[epoch][r], quota);
  }
}

// (b) A session is cut mid-epoch without a goodbye: its leases expire and go
// to the survivor, and the epoch still covers every sample once.
TEST(CoordinatorIntegrationTest, CutSessionsLeasesGoToTheSurvivor) {
  TempDir dir;
  auto server =
      testing::StartServer("sluice-coordinator", dir.path(), {kNoDataServers});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Connect(server->grpc_address);
  v1::CreateJobRequest req;
  *req.mutable_spec() = ManifestSpec("pool", 40, 0, 1);  // no quotas
  req.mutable_spec()->set_lease_ttl_ms(1000);
  v1::Job job;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->CreateJob(&ctx, req, &job).ok());
  Ledger ledger;
  RunResult dead =
      RunTrainer(stub.get(), "pool", 0, "doomed", &ledger, /*max_units=*/3);
  EXPECT_EQ(dead.units, 3);
  const absl::Time start = absl::Now();
  RunResult survivor = RunTrainer(stub.get(), "pool", 0, "survivor", &ledger);
  EXPECT_TRUE(survivor.job_done);
  EXPECT_TRUE(survivor.status.ok()) << survivor.status.error_message();
  // The doomed trainer's held leases came back within TTL + heartbeat.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  const auto& samples = ledger.acked[0];
  EXPECT_EQ(static_cast<int64_t>(samples.size()), job.status().total_samples());
  for (const auto& [sample, n] : samples) ASSERT_EQ(n, 1);
}

// (c) The coordinator is SIGKILLed mid-epoch and restarted on the same
// journal: the trainer reconnects under its id, nothing acknowledged is lost
// or repeated.
TEST(CoordinatorIntegrationTest, SigkillAndRestartLosesNothingAcknowledged) {
  TempDir dir;
  const std::string journal = "--journal_dir=" + dir.File("journal");
  auto first = testing::StartServer("sluice-coordinator", dir.path(),
                                    {journal, kNoDataServers});
  ASSERT_TRUE(first.ok()) << first.status();
  {
    auto stub = Connect(first->grpc_address);
    v1::CreateJobRequest req;
    *req.mutable_spec() = ManifestSpec("durable", 60, 2, 2);
    v1::Job job;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->CreateJob(&ctx, req, &job).ok());
  }
  Ledger ledger;
  {
    auto stub = Connect(first->grpc_address);
    RunTrainer(stub.get(), "durable", 0, "r0", &ledger, /*max_units=*/4);
    RunTrainer(stub.get(), "durable", 1, "r1", &ledger, /*max_units=*/2);
  }
  first->process.Signal(SIGKILL);
  ASSERT_TRUE(first->process.Wait(absl::Seconds(10)).ok());

  auto second = testing::StartServer("sluice-coordinator", dir.path(),
                                     {journal, kNoDataServers});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(testing::ReadWholeFile(second->log_path).value_or(""),
              HasSubstr("recovered"));
  auto stub = Connect(second->grpc_address);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest get;
    get.set_name("durable");
    ASSERT_TRUE(stub->GetJob(&ctx, get, &job).ok());
  }
  const int64_t quota = job.status().samples_per_rank();
  std::vector<RunResult> results(2);
  std::thread t0([&] {
    results[0] = RunTrainer(stub.get(), "durable", 0, "r0", &ledger);
  });
  std::thread t1([&] {
    results[1] = RunTrainer(stub.get(), "durable", 1, "r1", &ledger);
  });
  t0.join();
  t1.join();
  for (const RunResult& r : results) {
    EXPECT_TRUE(r.job_done);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
  ASSERT_EQ(ledger.acked.size(), 2u);
  for (const auto& [epoch, samples] : ledger.acked) {
    EXPECT_EQ(static_cast<int64_t>(samples.size()), quota * 2)
        << "epoch " << epoch;
    for (const auto& [sample, n] : samples)
      ASSERT_EQ(n, 1) << "epoch " << epoch;
    EXPECT_EQ(ledger.per_rank[epoch][0], quota);
    EXPECT_EQ(ledger.per_rank[epoch][1], quota);
  }
}

// Two coordinators on one journal directory would each append to it and
// one's acknowledged records would be lost at the next recovery: the second
// exits at start-up naming the first's PID, and the kernel releases the lock
// when the first dies (SIGKILL), so a restart is never blocked by a stale
// lock.
TEST(CoordinatorIntegrationTest, ASecondCoordinatorOnOneJournalIsRefused) {
  TempDir dir;
  const std::string journal = "--journal_dir=" + dir.File("journal");
  auto first = testing::StartServer("sluice-coordinator", dir.path(),
                                    {journal, kNoDataServers});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string log = dir.File("second.log");
  auto second = ChildProcess::Start(
      {testing::BinDir() + "/sluice-coordinator", "--listen=127.0.0.1:0",
       "--metrics_listen=127.0.0.1:0", journal, kNoDataServers},
      log);
  ASSERT_TRUE(second.ok());
  auto code = second->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(testing::ReadWholeFile(log).value_or(""),
              HasSubstr(absl::StrCat("journal directory ", dir.File("journal"),
                                     " is in use by another process (PID ",
                                     first->process.pid(), ")")));
  EXPECT_TRUE(first->process.running());
  first->process.Signal(SIGKILL);
  ASSERT_TRUE(first->process.Wait(absl::Seconds(10)).ok());
  mkdir(dir.File("third").c_str(), 0755);
  auto third = testing::StartServer("sluice-coordinator", dir.File("third"),
                                    {journal, kNoDataServers});
  EXPECT_TRUE(third.ok()) << third.status();
}

TEST(CoordinatorIntegrationTest, BadInputOverTheWire) {
  TempDir dir;
  mkdir(dir.File("manifests").c_str(), 0755);
  auto server = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {kNoDataServers, "--manifest_roots=" + dir.File("manifests")});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Connect(server->grpc_address);
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest get;
    get.set_name("ghost");
    v1::Job job;
    grpc::Status s = stub->GetJob(&ctx, get, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("ghost"));
  }
  {
    grpc::ClientContext ctx;
    v1::CreateJobRequest req;
    req.mutable_spec()->set_name("x");
    req.mutable_spec()->set_manifest_path(dir.File("manifests/missing.json"));
    v1::Job job;
    grpc::Status s = stub->CreateJob(&ctx, req, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("spec.manifest_path"));
  }
  {
    // A JSON manifest on disk is accepted.
    std::ofstream(dir.File("manifests/m.json"))
        << R"({"shards": [{"url": "/d/a.tar", "num_samples": 3}, {"url": "/d/b.tar", "num_samples": 4}]})";
    grpc::ClientContext ctx;
    v1::CreateJobRequest req;
    req.mutable_spec()->set_name("fromfile");
    req.mutable_spec()->set_manifest_path(
        dir.File("manifests/../manifests/m.json"));
    req.mutable_spec()->set_world_size(2);
    v1::Job job;
    grpc::Status s = stub->CreateJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(job.status().total_samples(), 7);
    EXPECT_EQ(job.status().samples_per_rank(), 3);
  }
  {
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    v1::TrainerMessage hello;
    hello.mutable_hello()->set_job("fromfile");
    hello.mutable_hello()->set_rank(2);
    stream->Write(hello);
    v1::CoordinatorMessage m;
    while (stream->Read(&m)) {
    }
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("hello.rank=2"));
  }
}

// manifest_path reads only regular files inside --manifest_roots, and no
// error quotes a file's content: a secret next to the manifests, "..", a
// symlink out, a FIFO (which would block a reader) and /dev/zero are all
// refused at once, each with the documented code; without --manifest_roots
// manifest_path is refused whole.
TEST(CoordinatorIntegrationTest, ManifestPathReadsOnlyManifestsInsideItsRoots) {
  TempDir dir;
  mkdir(dir.File("manifests").c_str(), 0755);
  const std::string secret = "do-not-leak-this-secret-4b1d";
  std::ofstream(dir.File("lease.secret")) << secret;
  std::ofstream(dir.File("manifests/garbage.json")) << secret;
  symlink(dir.File("lease.secret").c_str(),
          dir.File("manifests/link.json").c_str());
  mkfifo(dir.File("manifests/fifo.json").c_str(), 0644);
  auto server = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {kNoDataServers, "--manifest_roots=" + dir.File("manifests"),
       "--max_manifest_bytes=1000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Connect(server->grpc_address);
  auto create = [&](const std::string& path) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::CreateJobRequest req;
    req.mutable_spec()->set_name("m");
    req.mutable_spec()->set_manifest_path(path);
    v1::Job job;
    return stub->CreateJob(&ctx, req, &job);
  };
  struct Case {
    std::string path;
    grpc::StatusCode code;
    std::string says;
  };
  std::ofstream(dir.File("manifests/big.json")) << std::string(2000, ' ');
  const std::vector<Case> cases = {
      {dir.File("lease.secret"), grpc::StatusCode::PERMISSION_DENIED,
       "outside --manifest_roots"},
      {dir.File("manifests/../lease.secret"),
       grpc::StatusCode::PERMISSION_DENIED, "outside --manifest_roots"},
      {dir.File("manifests/link.json"), grpc::StatusCode::PERMISSION_DENIED,
       "through a symlink"},
      {dir.File("manifests/garbage.json"), grpc::StatusCode::INVALID_ARGUMENT,
       "is not a JSON manifest"},
      {dir.File("manifests/fifo.json"), grpc::StatusCode::INVALID_ARGUMENT,
       "is not a regular file"},
      {dir.File("manifests/big.json"), grpc::StatusCode::INVALID_ARGUMENT,
       "the limit is 1000 (--max_manifest_bytes)"},
      {"/dev/zero", grpc::StatusCode::PERMISSION_DENIED,
       "outside --manifest_roots"},
      {"relative.json", grpc::StatusCode::INVALID_ARGUMENT,
       "not an absolute path"},
  };
  for (const Case& c : cases) {
    grpc::Status s = create(c.path);
    EXPECT_EQ(s.error_code(), c.code) << c.path << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("spec.manifest_path")) << c.path;
    EXPECT_THAT(s.error_message(), HasSubstr(c.says)) << c.path;
    EXPECT_THAT(s.error_message(), Not(HasSubstr("do-not-leak"))) << c.path;
  }

  // A coordinator without --manifest_roots reads no file at all.
  auto closed =
      testing::StartServer("sluice-coordinator", dir.path(), {kNoDataServers});
  ASSERT_TRUE(closed.ok()) << closed.status();
  auto closed_stub = Connect(closed->grpc_address);
  grpc::ClientContext ctx;
  v1::CreateJobRequest req;
  req.mutable_spec()->set_name("m");
  req.mutable_spec()->set_manifest_path(dir.File("manifests/garbage.json"));
  v1::Job job;
  grpc::Status s = closed_stub->CreateJob(&ctx, req, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("--manifest_roots"));
}

// Resident memory of `pid`, from /proc.
int64_t RssBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// A Session that keeps sending and never reads its replies: the server's
// queue for it is bounded, the stream ends with RESOURCE_EXHAUSTED, and the
// coordinator stays small and answers others meanwhile.
TEST(CoordinatorIntegrationTest, ASessionThatNeverReadsIsEndedNotBuffered) {
  TempDir dir;
  auto server =
      testing::StartServer("sluice-coordinator", dir.path(), {kNoDataServers});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Connect(server->grpc_address);
  {
    grpc::ClientContext ctx;
    v1::CreateJobRequest req;
    req.mutable_spec()->set_name("j");
    auto* shard = req.mutable_spec()->mutable_manifest()->add_shards();
    shard->set_url("/d/a.tar");
    shard->set_num_samples(10);
    v1::Job job;
    ASSERT_TRUE(stub->CreateJob(&ctx, req, &job).ok());
  }
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::TrainerMessage hello;
  hello.mutable_hello()->set_job("j");
  ASSERT_TRUE(stream->Write(hello));
  // Each bogus Progress is answered with a Rejected the client never reads.
  v1::TrainerMessage progress;
  progress.mutable_progress()->mutable_lease()->set_lease_id(
      std::string(200, 'x'));
  progress.mutable_progress()->set_consumed(1);
  // Up to 200,000 (the writes fail soon after the server ends the
  // stream): the transport's windows absorb tens of thousands of replies
  // before the server's queue of 65,536 fills.
  for (int i = 0; i < 200000 && stream->Write(progress); ++i) {
  }
  stream->WritesDone();  // without the bound, the server would end with OK
                         // after reading all
  v1::CoordinatorMessage m;
  while (stream->Read(&m)) {
  }
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("has not read"));
  EXPECT_LT(RssBytes(server->process.pid()), int64_t{512} << 20);
  grpc::ClientContext list_ctx;
  v1::ListJobsResponse jobs;
  EXPECT_TRUE(stub->ListJobs(&list_ctx, v1::ListJobsRequest(), &jobs).ok());
}

// A one-shard job "guarded", for the tests of who may create jobs.
v1::CreateJobRequest GuardedJobRequest() {
  v1::CreateJobRequest req;
  req.mutable_spec()->set_name("guarded");
  auto* shard = req.mutable_spec()->mutable_manifest()->add_shards();
  shard->set_url("/d/a.tar");
  shard->set_num_samples(3);
  return req;
}

// With --admin_token_file, creating and deleting jobs needs the operator
// token; reading job state and training need none.
TEST(CoordinatorIntegrationTest, JobAdministrationNeedsTheOperatorToken) {
  TempDir dir;
  std::ofstream(dir.File("admin.token")) << "op-token-7f3a\n";
  std::ofstream(dir.File("wrong.token")) << "guess";
  std::ofstream(dir.File("m.json"))
      << R"({"shards": [{"url": "/d/a.tar", "num_samples": 3}]})";
  auto server = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {kNoDataServers, "--admin_token_file=" + dir.File("admin.token")});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Connect(server->grpc_address);
  auto create = [&](const std::string& authorization) {
    grpc::ClientContext ctx;
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    v1::Job job;
    return stub->CreateJob(&ctx, GuardedJobRequest(), &job);
  };
  grpc::Status none = create("");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(
      none.error_message(),
      HasSubstr("CreateJob needs an operator credential: the token (metadata"));
  EXPECT_EQ(create("Bearer guess").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(create("Bearer op-token-7f3a-and-more").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(create("Bearer op-token-7f3a").ok());
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest get;
    get.set_name("guarded");
    v1::Job job;
    EXPECT_TRUE(stub->GetJob(&ctx, get, &job).ok());  // reading needs no token
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteJobRequest del;
    del.set_name("guarded");
    v1::DeleteJobResponse response;
    EXPECT_EQ(stub->DeleteJob(&ctx, del, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // sluicectl sends the token from --admin_token_file.
  const std::string ctl = testing::BinDir() + "/sluicectl";
  auto run = [&](const std::string& token_file, const std::string& log) {
    auto p = ChildProcess::Start(
        {ctl, "job", "create", "--name=bycli",
         "--manifest=" + dir.File("m.json"), "--admin_token_file=" + token_file,
         "--coordinator=" + server->grpc_address},
        dir.File(log));
    EXPECT_TRUE(p.ok());
    auto code = p->Wait(absl::Seconds(30));
    EXPECT_TRUE(code.ok());
    return code.ok() ? *code : -1;
  };
  EXPECT_EQ(run(dir.File("wrong.token"), "wrong.log"), 1);
  EXPECT_EQ(run(dir.File("admin.token"), "right.log"), 0);
}

// A coordinator with a lease secret is a secured deployment: without an
// operator credential configured, nobody may create or delete jobs (the
// refusal names the flags), while reading and training stay open.
// --allow_unauthenticated_admin opts out.
TEST(CoordinatorIntegrationTest,
     ASecuredCoordinatorRefusesAdministrationWithoutOperators) {
  TempDir dir;
  std::ofstream(dir.File("secret")) << "a lease secret\n";
  auto create = [](const std::string& address) {
    grpc::ClientContext ctx;
    v1::Job job;
    return Connect(address)->CreateJob(&ctx, GuardedJobRequest(), &job);
  };
  {
    auto server = testing::StartServer(
        "sluice-coordinator", dir.path(),
        {kNoDataServers, "--lease_secret_file=" + dir.File("secret"),
         "--journal_dir=" + dir.File("j1")});
    ASSERT_TRUE(server.ok()) << server.status();
    grpc::Status refused = create(server->grpc_address);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(refused.error_message(),
                HasSubstr("CreateJob is refused: this coordinator has TLS or a "
                          "lease secret but "
                          "accepts no operator credential (start it with "
                          "--admin_token_file"));
    grpc::ClientContext ctx;
    v1::ListJobsResponse jobs;
    EXPECT_TRUE(Connect(server->grpc_address)
                    ->ListJobs(&ctx, v1::ListJobsRequest(), &jobs)
                    .ok());
  }
  auto open = testing::StartServer(
      "sluice-coordinator", dir.path(),
      {kNoDataServers, "--lease_secret_file=" + dir.File("secret"),
       "--journal_dir=" + dir.File("j2"), "--allow_unauthenticated_admin"});
  ASSERT_TRUE(open.ok()) << open.status();
  grpc::Status created = create(open->grpc_address);
  EXPECT_TRUE(created.ok()) << created.error_message();
  // Identities without mutual TLS cannot match any call: a startup error.
  auto child = ChildProcess::Start(
      {testing::BinDir() + "/sluice-coordinator", "--listen=127.0.0.1:0",
       "--metrics_listen=127.0.0.1:0", "--journal_dir=" + dir.File("j3"),
       "--admin_identities=ops"},
      dir.File("identities.log"));
  ASSERT_TRUE(child.ok());
  auto code = child->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  EXPECT_THAT(testing::ReadWholeFile(dir.File("identities.log")).value_or(""),
              HasSubstr("--admin_identities needs --tls_client_ca"));
}

// Per-job series: sessions are counted per job (label sluice_job, not job:
// Prometheus owns that one), and a deleted job's series disappear instead of
// lingering at their last values.
TEST(CoordinatorIntegrationTest, PerJobSeriesFollowSessionsAndDeletion) {
  TempDir dir;
  auto server =
      testing::StartServer("sluice-coordinator", dir.path(), {kNoDataServers});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(
      testing::CreateJob(server->grpc_address, ManifestSpec("kept", 4, 1, 1))
          .ok());
  ASSERT_TRUE(
      testing::CreateJob(server->grpc_address, ManifestSpec("gone", 4, 1, 1))
          .ok());
  auto stub = Connect(server->grpc_address);
  grpc::ClientContext ctx;
  auto session = stub->Session(&ctx);
  v1::TrainerMessage hello;
  hello.mutable_hello()->set_job("gone");
  hello.mutable_hello()->set_trainer_id("t0");
  ASSERT_TRUE(session->Write(hello));
  ASSERT_TRUE(testing::WaitForMetric(
      server->metrics_address,
      "sluice_coordinator_sessions{sluice_job=\"gone\"} 1"));
  ASSERT_TRUE(testing::WaitForMetric(
      server->metrics_address,
      "sluice_coordinator_sessions{sluice_job=\"kept\"} 0"));
  {
    grpc::ClientContext del;
    v1::DeleteJobRequest request;
    request.set_name("gone");
    v1::DeleteJobResponse response;
    ASSERT_TRUE(stub->DeleteJob(&del, request, &response).ok());
  }
  v1::CoordinatorMessage m;
  while (session->Read(&m)) {
  }
  EXPECT_EQ(session->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  auto page =
      testing::HttpGet("http://" + server->metrics_address + "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(page->body,
              ::testing::Not(::testing::HasSubstr("sluice_job=\"gone\"")));
  EXPECT_THAT(
      page->body,
      ::testing::HasSubstr("sluice_coordinator_epoch{sluice_job=\"kept\"} 0"));
}

// Rank skew: one of two ranks completes a lease, the other nothing; the
// gauge shows the difference, for the dashboard's straggler panel.
TEST(CoordinatorIntegrationTest, RankSkewIsTheLeadOfTheMostAdvancedRank) {
  TempDir dir;
  auto server =
      testing::StartServer("sluice-coordinator", dir.path(), {kNoDataServers});
  ASSERT_TRUE(server.ok()) << server.status();
  v1::JobSpec spec = ManifestSpec("skew", 8, 2, 1);
  spec.set_lease_ttl_ms(60000);
  ASSERT_TRUE(testing::CreateJob(server->grpc_address, spec).ok());
  ASSERT_TRUE(testing::WaitForMetric(
      server->metrics_address,
      "sluice_coordinator_rank_skew_samples{sluice_job=\"skew\"} 0"));
  auto stub = Connect(server->grpc_address);
  grpc::ClientContext ctx;
  auto session = stub->Session(&ctx);
  v1::TrainerMessage hello;
  hello.mutable_hello()->set_job("skew");
  hello.mutable_hello()->set_rank(0);
  hello.mutable_hello()->set_trainer_id("rank-0");
  v1::TrainerMessage want;
  want.mutable_want()->set_credits(1);
  ASSERT_TRUE(session->Write(hello) && session->Write(want));
  v1::CoordinatorMessage m;
  while (session->Read(&m) && !m.has_grant()) {
  }
  ASSERT_TRUE(m.has_grant());
  const int64_t size =
      m.grant().lease().unit().end() - m.grant().lease().unit().begin();
  ASSERT_GT(size, 0);
  v1::TrainerMessage complete;
  complete.mutable_complete()->mutable_lease()->set_lease_id(
      m.grant().lease().lease_id());
  complete.mutable_complete()->mutable_lease()->set_fence(
      m.grant().lease().fence());
  ASSERT_TRUE(session->Write(complete));
  EXPECT_TRUE(testing::WaitForMetric(
      server->metrics_address,
      absl::StrCat("sluice_coordinator_rank_skew_samples{sluice_job=\"skew\"} ",
                   size)));
  ctx.TryCancel();
  session->Finish().ok();
}

}  // namespace
}  // namespace sluice
