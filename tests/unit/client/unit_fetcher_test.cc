#include "client/cpp/unit_fetcher.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/cpp/completion_loop.h"
#include "client/cpp/held_unit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sluice/v1/dataserver.grpc.pb.h"
#include "tests/testing/fake_clock.h"

namespace sluice::client_internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A data server whose ReadSamples follows a script, on 127.0.0.1:0.
class ScriptedDataServer final : public v1::DataServer::Service {
 public:
  enum class Script {
    kServe,          // every sample from the request's start, two a batch
    kOneThenSilent,  // one batch, then nothing until the test ends
    kCorrupt,        // DATA_LOSS at once
    kBusyOnce,       // RESOURCE_EXHAUSTED on the first call, then kServe
    kOneThenBroken,  // one batch; UNAVAILABLE (a connection lost) once
                     // Release is called
  };

  explicit ScriptedDataServer(Script script) : script_(script) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedDataServer() override {
    Release();
    server_->Shutdown();
  }

  // Lets the calls waiting in kOneThenSilent and kOneThenBroken end.
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  grpc::Status ReadSamples(
      grpc::ServerContext*, const v1::ReadRequest* request,
      grpc::ServerWriter<v1::SampleBatch>* writer) override {
    int call;
    {
      absl::MutexLock lock(&mu_);
      call = ++calls_;
    }
    switch (script_) {
      case Script::kCorrupt:
        return grpc::Status(grpc::StatusCode::DATA_LOSS,
                            "shard s.tar member 3.jpg: not a JPEG");
      case Script::kBusyOnce:
        if (call == 1) {
          return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              "tenant t has 1 of 1 streams open");
        }
        break;
      case Script::kOneThenSilent: {
        v1::SampleBatch batch;
        batch.add_samples()->set_index(request->start());
        writer->Write(batch);
        release_.WaitForNotification();
        return grpc::Status::OK;
      }
      case Script::kOneThenBroken: {
        v1::SampleBatch batch;
        batch.add_samples()->set_index(request->start());
        writer->Write(batch);
        release_.WaitForNotification();
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "Broken pipe");
      }
      case Script::kServe:
        break;
    }
    const int64_t end = request->lease().unit().end();
    for (int64_t i = request->start(); i < end; i += 2) {
      v1::SampleBatch batch;
      for (int64_t j = i; j < std::min(end, i + 2); ++j) {
        batch.add_samples()->set_index(j);
      }
      writer->Write(batch);
    }
    return grpc::Status::OK;
  }

 private:
  const Script script_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Notification release_;
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// A UnitFetcher over units on one scripted data server, the test as its
// listener.
class UnitFetcherTest : public ::testing::Test, public FetchListener {
 protected:
  void Start(ScriptedDataServer::Script script) {
    server_.emplace(script);
    options_.stall_timeout = absl::Seconds(10);
    loop_.Start();
    fetcher_.emplace(options_, &mu_, &units_, &loop_, &clock_, this);
  }

  void TearDown() override {
    if (!fetcher_.has_value()) return;
    {
      absl::MutexLock lock(&mu_);
      fetcher_->SetClosedLocked();
      fetcher_->SetClosingLocked();
      for (auto& [id, u] : units_) fetcher_->CancelLocked(*u);
      mu_.Await(absl::Condition(this, &UnitFetcherTest::AllCallsDone));
      units_.clear();
    }
    loop_.Shutdown();
  }

  bool AllCallsDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, u] : units_) {
      if (u->fetch_started && !u->call_done) return false;
    }
    return true;
  }

  // Holds samples [0, samples) of shard 0 under lease `id`.
  HeldUnit& Hold(const std::string& id, int64_t samples)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto u = std::make_shared<HeldUnit>(&*fetcher_);
    u->lease.set_lease_id(id);
    u->lease.set_fence(1);
    u->lease.set_job("j");
    u->lease.set_data_server(server_->address());
    u->lease.mutable_unit()->set_begin(0);
    u->lease.mutable_unit()->set_end(samples);
    u->lease.mutable_unit()->mutable_shard()->set_url("/shards/s.tar");
    u->size = samples;
    u->order = static_cast<int64_t>(units_.size());
    units_[id] = u;
    return *u;
  }

  // Waits (on the fetcher's own notifications) until `done` holds.
  template <typename F>
  void AwaitLocked(F done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    struct Predicate {
      F* f;
      bool operator()() const { return (*f)(); }
    };
    Predicate p{&done};
    mu_.Await(absl::Condition(&p));
  }

  static std::vector<int64_t> Indexes(const HeldUnit& u) {
    std::vector<int64_t> out;
    for (const Sample& s : u.buffer) out.push_back(s.index);
    return out;
  }

  // FetchListener.
  void SamplesArrivedLocked() override {}
  void FetchEndedLocked() override {
    ++ended_;
    fetcher_->StartEligibleLocked();
  }
  void FailLocked(absl::Status status) override { fatal_ = status; }
  void TransportCheckQueuedLocked() override {}

  ReaderOptions options_;
  std::optional<ScriptedDataServer> server_;
  testing::FakeClock clock_;
  CompletionLoop loop_;
  absl::Mutex mu_;
  HeldUnits units_ ABSL_GUARDED_BY(mu_);
  std::optional<UnitFetcher> fetcher_;
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
};

TEST_F(UnitFetcherTest, ReadsAUnitToItsEndInOrder) {
  Start(ScriptedDataServer::Script::kServe);
  absl::MutexLock lock(&mu_);
  HeldUnit& u = Hold("a", 5);
  fetcher_->StartEligibleLocked();
  AwaitLocked([&u] { return u.call_done; });
  EXPECT_EQ(u.fetch, HeldUnit::Fetch::kDone);
  EXPECT_THAT(Indexes(u), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(fetcher_->batches(), 3);
  EXPECT_EQ(ended_, 1);
  EXPECT_TRUE(fatal_.ok());
}

TEST_F(UnitFetcherTest, OneStreamPerServerAtATimeInGrantOrder) {
  Start(ScriptedDataServer::Script::kServe);
  absl::MutexLock lock(&mu_);
  HeldUnit& a = Hold("a", 3);
  HeldUnit& b = Hold("b", 3);
  fetcher_->StartEligibleLocked();
  EXPECT_TRUE(a.fetch_started);
  EXPECT_FALSE(b.fetch_started);  // its turn comes as a's stream ends
  AwaitLocked([&a, &b] { return a.call_done && b.call_done; });
  EXPECT_EQ(a.fetch, HeldUnit::Fetch::kDone);
  EXPECT_EQ(b.fetch, HeldUnit::Fetch::kDone);
  EXPECT_THAT(Indexes(b), ElementsAre(0, 1, 2));
  EXPECT_EQ(server_->calls(), 2);
}

TEST_F(UnitFetcherTest, AStreamSilentPastTheStallTimeoutIsCancelled) {
  Start(ScriptedDataServer::Script::kOneThenSilent);
  absl::MutexLock lock(&mu_);
  HeldUnit& a = Hold("a", 5);
  HeldUnit& b = Hold("b", 5);
  fetcher_->StartEligibleLocked();
  AwaitLocked([&a] { return a.buffer.size() == 1; });
  // Silent for just the timeout on the fetcher's clock: not yet.
  clock_.Advance(options_.stall_timeout);
  fetcher_->CancelStalledLocked(clock_.Now());
  EXPECT_FALSE(a.stalled);
  clock_.Advance(absl::Milliseconds(1));
  fetcher_->CancelStalledLocked(clock_.Now());
  EXPECT_TRUE(a.stalled);
  AwaitLocked([&a] { return a.call_done; });
  EXPECT_EQ(a.fetch, HeldUnit::Fetch::kFailed);
  EXPECT_THAT(a.fetch_error, HasSubstr("no data for 10s"));
  EXPECT_THAT(Indexes(a), ElementsAre(0));
  // The unit waiting for its turn on the same server fails with it,
  // unopened.
  EXPECT_EQ(b.fetch, HeldUnit::Fetch::kFailed);
  EXPECT_THAT(b.fetch_error, HasSubstr("(another stream of the server)"));
  EXPECT_EQ(server_->calls(), 1);
}

TEST_F(UnitFetcherTest, CorruptDataFailsTheReaderNamingTheLease) {
  Start(ScriptedDataServer::Script::kCorrupt);
  absl::MutexLock lock(&mu_);
  HeldUnit& u = Hold("lease-7", 5);
  fetcher_->StartEligibleLocked();
  AwaitLocked([&u] { return u.call_done; });
  EXPECT_EQ(fatal_.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(fatal_.message(), HasSubstr("lease lease-7: shard s.tar"));
}

TEST_F(UnitFetcherTest, ARefusedStreamOpensAgainOnTheSameServer) {
  Start(ScriptedDataServer::Script::kBusyOnce);
  absl::MutexLock lock(&mu_);
  HeldUnit& u = Hold("a", 4);
  fetcher_->StartEligibleLocked();
  AwaitLocked(
      [&u] { return u.call_done && u.fetch != HeldUnit::Fetch::kRunning; });
  EXPECT_EQ(u.fetch, HeldUnit::Fetch::kDone);
  EXPECT_THAT(Indexes(u), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(u.busy_retries, 1);
  EXPECT_EQ(server_->calls(), 2);
  EXPECT_TRUE(fatal_.ok());
}

// A data server that drains finishes its calls, then stops; the last
// batches can still be in the sockets, and the reader's stream breaks. On a
// server the coordinator said is leaving, that gives the rest of the unit
// back (from the sample after the last one received): it is not a fault to
// re-route around.
TEST_F(UnitFetcherTest, AStreamBrokenByALeavingServerIsHandedBack) {
  Start(ScriptedDataServer::Script::kOneThenBroken);
  absl::MutexLock lock(&mu_);
  HeldUnit& u = Hold("a", 4);
  fetcher_->StartEligibleLocked();
  AwaitLocked([&u] { return u.next_fetch == 1; });
  fetcher_->HandBackUnopenedLocked(server_->address(), "draining");
  server_->Release();
  AwaitLocked([&u] { return u.fetch != HeldUnit::Fetch::kRunning; });
  EXPECT_EQ(u.fetch, HeldUnit::Fetch::kFailed);
  EXPECT_TRUE(u.handed_back);
  EXPECT_THAT(u.fetch_error, HasSubstr("Broken pipe"));
  EXPECT_THAT(Indexes(u), ElementsAre(0));
  EXPECT_TRUE(fatal_.ok());
}

// A stream opening on a server that drained before means the coordinator
// routes there again (it registered anew): its streams breaking are faults
// again, re-routed.
TEST_F(UnitFetcherTest, AServerThatRegisteredAgainAfterADrainIsNotLeaving) {
  Start(ScriptedDataServer::Script::kOneThenBroken);
  absl::MutexLock lock(&mu_);
  fetcher_->HandBackUnopenedLocked(server_->address(), "draining");
  HeldUnit& u = Hold("a", 4);
  fetcher_->StartEligibleLocked();
  AwaitLocked([&u] { return u.next_fetch == 1; });
  server_->Release();
  AwaitLocked([&u] { return u.fetch != HeldUnit::Fetch::kRunning; });
  EXPECT_EQ(u.fetch, HeldUnit::Fetch::kFailed);
  EXPECT_FALSE(u.handed_back);
  EXPECT_THAT(u.fetch_error, HasSubstr("Broken pipe"));
  EXPECT_TRUE(fatal_.ok());
}

// A coordinator with a lease secret sends a held lease's grant again with a
// fresh token while its stream runs; the reader replaces the lease under
// its lock. The samples arriving meanwhile still carry the lease's epoch
// and shard (the conversion reads the stream's own request: under
// ThreadSanitizer, reading u.lease there is a data race).
TEST_F(UnitFetcherTest, AGrantSentAgainMidStreamLeavesTheSamplesAlone) {
  const int64_t samples = 400;
  options_.buffer_samples = samples;  // the whole unit fits: no consumer
  Start(ScriptedDataServer::Script::kServe);
  HeldUnit* u;
  {
    absl::MutexLock lock(&mu_);
    u = &Hold("a", samples);
    u->lease.set_epoch(3);
    fetcher_->StartEligibleLocked();
  }
  for (int refresh = 0;; ++refresh) {
    absl::MutexLock lock(&mu_);
    if (u->call_done) break;
    v1::Lease again = u->lease;
    again.set_token(absl::StrCat("token-", refresh));
    again.set_expires_at_unix_ms(1000 + refresh);
    u->lease = again;
  }
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(u->fetch, HeldUnit::Fetch::kDone);
  ASSERT_EQ(u->buffer.size(), static_cast<size_t>(samples));
  for (const Sample& s : u->buffer) {
    EXPECT_EQ(s.epoch, 3);
    EXPECT_EQ(s.shard_url, "/shards/s.tar");
    EXPECT_EQ(s.data_server, server_->address());
  }
}

}  // namespace
}  // namespace sluice::client_internal
