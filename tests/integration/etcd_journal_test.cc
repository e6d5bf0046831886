// EtcdJournal against a real etcd (Debian's etcd-server) on 127.0.0.1.
#include "server/coordinator/etcd_journal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/testing/etcd.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::Etcd;
using ::sluice::testing::StatusIs;
using ::sluice::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

JournalRecord Deleted(const std::string& job) {
  JournalRecord r;
  r.mutable_job_deleted()->set_job(job);
  return r;
}

class EtcdJournalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto etcd = Etcd::Start(dir_->path());
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = etcd->release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    delete dir_;
  }

  void SetUp() override {
    channel_ = grpc::CreateChannel(etcd_->endpoint(),
                                   grpc::InsecureChannelCredentials());
    kv_ = etcdserverpb::KV::NewStub(channel_);
  }

  // A prefix of this test's own.
  std::string Prefix() const {
    return absl::StrCat(
        "/t/", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }

  EtcdJournalOptions Options(const std::string& identity = "coord-a:7070") {
    EtcdJournalOptions o;
    o.endpoints = {etcd_->endpoint()};
    o.prefix = Prefix();
    o.identity = identity;
    o.election_ttl = absl::Seconds(2);
    return o;
  }

  // Opens the journal and collects the replayed job names.
  absl::StatusOr<std::unique_ptr<EtcdJournal>> Open(
      std::vector<std::string>* seen, EtcdJournalOptions options) {
    return EtcdJournal::Open(
        std::move(options),
        [seen](const JournalRecord& r) {
          seen->push_back(r.job_deleted().job());
          return absl::OkStatus();
        },
        [seen] { seen->clear(); });
  }
  absl::StatusOr<std::unique_ptr<EtcdJournal>> Open(
      std::vector<std::string>* seen) {
    return Open(seen, Options());
  }

  // Keys under this test's prefix + `rest`.
  std::vector<std::string> Keys(const std::string& rest) {
    etcdserverpb::RangeRequest req;
    req.set_key(Prefix() + "/" + rest);
    std::string end = req.key();
    end.back() = static_cast<char>(end.back() + 1);
    req.set_range_end(end);
    req.set_keys_only(true);
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(kv_->Range(&ctx, req, &resp).ok());
    std::vector<std::string> out;
    for (const auto& kv : resp.kvs()) out.push_back(kv.key());
    return out;
  }

  void Put(const std::string& key, const std::string& value) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(kv_->Put(&ctx, req, &resp).ok());
  }

  void Delete(const std::string& key) {
    etcdserverpb::DeleteRangeRequest req;
    req.set_key(key);
    etcdserverpb::DeleteRangeResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(kv_->DeleteRange(&ctx, req, &resp).ok());
  }

  static TempDir* dir_;
  static Etcd* etcd_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
};

TempDir* EtcdJournalTest::dir_ = nullptr;
Etcd* EtcdJournalTest::etcd_ = nullptr;

TEST_F(EtcdJournalTest, RoundTripAndAppendAfterReopen) {
  {
    std::vector<std::string> seen;
    auto j = Open(&seen);
    ASSERT_OK(j);
    EXPECT_TRUE(seen.empty());
    ASSERT_OK((*j)->Append({Deleted("a"), Deleted("b")}));
    ASSERT_OK((*j)->Append({Deleted("c")}));
    // One key per group commit.
    EXPECT_EQ(Keys("log/").size(), 2u);
  }
  {
    std::vector<std::string> seen;
    auto j = Open(&seen);
    ASSERT_OK(j);
    EXPECT_THAT(seen, ElementsAre("a", "b", "c"));
    EXPECT_EQ((*j)->replayed_records(), 3);
    ASSERT_OK((*j)->Append({Deleted("d")}));
  }
  std::vector<std::string> seen;
  ASSERT_OK(Open(&seen));
  EXPECT_THAT(seen, ElementsAre("a", "b", "c", "d"));
}

TEST_F(EtcdJournalTest, ConcurrentAppendsAreAllDurableAndWhole) {
  {
    std::vector<std::string> seen;
    auto j = Open(&seen);
    ASSERT_OK(j);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 40; ++i) {
          ASSERT_OK((*j)->Append({Deleted(absl::StrCat(t, "-", i))}));
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  std::vector<std::string> seen;
  ASSERT_OK(Open(&seen));
  ASSERT_EQ(seen.size(), 320u);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
}

TEST_F(EtcdJournalTest, ARecordLargerThanEtcdsRequestLimitIsSplitAndReplayed) {
  const std::string big(3 << 20, 'x');  // 3 MiB: four 1 MiB chunks
  {
    std::vector<std::string> seen;
    auto j = Open(&seen);
    ASSERT_OK(j);
    ASSERT_OK((*j)->Append({Deleted("before")}));
    ASSERT_OK((*j)->Append({Deleted(big)}));
    ASSERT_OK((*j)->Append({Deleted("after")}));
    EXPECT_EQ(Keys("log/").size(), 1u + 4u + 1u);
  }
  std::vector<std::string> seen;
  ASSERT_OK(Open(&seen));
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], "before");
  EXPECT_EQ(seen[1], big);
  EXPECT_EQ(seen[2], "after");
}

TEST_F(EtcdJournalTest, CompactReplacesTheLogWithTheSnapshot) {
  {
    std::vector<std::string> seen;
    auto j = Open(&seen);
    ASSERT_OK(j);
    ASSERT_OK((*j)->Append({Deleted("a")}));
    ASSERT_OK((*j)->Append({Deleted("b")}));
    const int64_t before = (*j)->bytes_written();
    ASSERT_OK((*j)->Compact(Deleted("snapshot")));
    EXPECT_LT((*j)->bytes_written(), before);
    EXPECT_TRUE(Keys("log/").empty());
    ASSERT_OK((*j)->Append({Deleted("c")}));
    ASSERT_OK((*j)->Compact(Deleted("snapshot-2")));
    ASSERT_OK((*j)->Append({Deleted("d")}));
    // Only the newest snapshot's data is kept.
    EXPECT_EQ(Keys("snapdata/").size(), 1u);
    EXPECT_EQ(Keys("log/").size(), 1u);
  }
  std::vector<std::string> seen;
  ASSERT_OK(Open(&seen));
  EXPECT_THAT(seen, ElementsAre("snapshot-2", "d"));
}

// Records appended by another thread while the snapshot is written follow
// it, in order, each once; the log they were written to goes with the
// switch.
TEST_F(EtcdJournalTest, AppendsDuringACompactionFollowTheSnapshot) {
  constexpr int kConcurrent = 50;
  {
    std::vector<std::string> seen;
    auto j = Open(&seen);
    ASSERT_OK(j);
    EtcdJournal& journal = **j;
    ASSERT_OK(journal.Append({Deleted("a")}));
    journal.BeginCompaction();
    ASSERT_OK(journal.Append({Deleted("b")}));
    std::thread appender([&journal] {
      for (int i = 0; i < kConcurrent; ++i) {
        ASSERT_OK(journal.Append({Deleted(absl::StrCat("c", i))}));
      }
    });
    ASSERT_OK(journal.FinishCompaction(Deleted("snapshot")));
    appender.join();
    ASSERT_OK(journal.Append({Deleted("d")}));
    EXPECT_FALSE(Keys("snapdata/").empty());
  }
  std::vector<std::string> want = {"snapshot", "b"};
  for (int i = 0; i < kConcurrent; ++i) want.push_back(absl::StrCat("c", i));
  want.push_back("d");
  std::vector<std::string> seen;
  ASSERT_OK(Open(&seen));
  EXPECT_EQ(seen, want);
}

TEST_F(EtcdJournalTest, ATornLastCommitIsDeletedAndTheRestReplayed) {
  {
    std::vector<std::string> seen;
    auto j = Open(&seen);
    ASSERT_OK(j);
    ASSERT_OK((*j)->Append({Deleted("a")}));
  }
  // The first chunk of a commit whose last chunk was never written (a
  // coordinator killed between the transactions of a large commit).
  const std::string torn = Prefix() + "/log/00000000000000000099";
  Put(torn, std::string(1, '\x01') + "\x05\x00\x00\x00" + "par");
  {
    std::vector<std::string> seen;
    auto j = Open(&seen);
    ASSERT_OK(j);
    EXPECT_THAT(seen, ElementsAre("a"));
    EXPECT_EQ(Keys("log/").size(), 1u);  // the torn chunk is gone
    ASSERT_OK((*j)->Append({Deleted("b")}));
  }
  std::vector<std::string> seen;
  ASSERT_OK(Open(&seen));
  EXPECT_THAT(seen, ElementsAre("a", "b"));
}

TEST_F(EtcdJournalTest, ACommitWithoutItsLastChunkBeforeOthersIsDataLoss) {
  {
    std::vector<std::string> seen;
    ASSERT_OK(Open(&seen));
  }
  const std::string bad = Prefix() + "/log/00000000000000000001";
  Put(bad, std::string(1, '\x01') + "xx");
  Put(Prefix() + "/log/00000000000000000002", std::string(1, '\x03'));
  std::vector<std::string> seen;
  EXPECT_THAT(Open(&seen),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(bad)));
}

TEST_F(EtcdJournalTest, AStandbyWaitsAndTakesOverWhenTheLeaderCloses) {
  std::vector<std::string> seen_a;
  auto a = Open(&seen_a, Options("coord-a:7070"));
  ASSERT_OK(a);
  ASSERT_OK((*a)->Append({Deleted("from-a")}));
  absl::Notification standby;
  std::string leader_seen;
  EtcdJournalOptions b_options = Options("coord-b:7070");
  b_options.on_standby = [&](const std::string& leader) {
    leader_seen = leader;
    standby.Notify();
  };
  std::vector<std::string> seen_b;
  absl::StatusOr<std::unique_ptr<EtcdJournal>> b;
  std::thread opener([&] { b = Open(&seen_b, b_options); });
  standby.WaitForNotification();
  EXPECT_EQ(leader_seen, "coord-a:7070");
  a->reset();  // revokes a's lease: b wins at once
  opener.join();
  ASSERT_OK(b);
  EXPECT_THAT(seen_b, ElementsAre("from-a"));
  EXPECT_GT((*b)->leader_revision(), 0);
  ASSERT_OK((*b)->Append({Deleted("from-b")}));
}

TEST_F(EtcdJournalTest, AStandbyAppliesTheLeadersCommitsWhileItWaits) {
  std::vector<std::string> seen_a;
  auto a = Open(&seen_a, Options("coord-a:7070"));
  ASSERT_OK(a);
  ASSERT_OK((*a)->Append({Deleted("x")}));
  absl::Mutex mu;
  std::vector<std::string> seen_b;
  auto b_seen = [&] {
    absl::MutexLock lock(&mu);
    return seen_b;
  };
  // Polls b's applied records until they are `want` (b is still waiting).
  auto b_reaches = [&](const std::vector<std::string>& want) {
    return testing::WaitUntil([&] { return b_seen() == want; },
                              absl::Seconds(30));
  };
  absl::StatusOr<std::unique_ptr<EtcdJournal>> b;
  std::thread opener([&] {
    b = EtcdJournal::Open(
        Options("coord-b:7070"),
        [&](const JournalRecord& r) {
          absl::MutexLock lock(&mu);
          seen_b.push_back(r.job_deleted().job());
          return absl::OkStatus();
        },
        [&] {
          absl::MutexLock lock(&mu);
          seen_b.clear();
        });
  });
  EXPECT_TRUE(b_reaches({"x"}));
  ASSERT_OK((*a)->Append({Deleted("y")}));
  EXPECT_TRUE(b_reaches({"x", "y"}));
  // The leader compacts: the standby starts over from the snapshot.
  ASSERT_OK((*a)->Compact(Deleted("snapshot")));
  ASSERT_OK((*a)->Append({Deleted("z")}));
  EXPECT_TRUE(b_reaches({"snapshot", "z"}));
  a->reset();
  opener.join();
  ASSERT_OK(b);
  EXPECT_THAT(b_seen(), ElementsAre("snapshot", "z"));
  ASSERT_OK((*b)->Append({Deleted("from-b")}));
  b->reset();
  std::vector<std::string> seen;
  ASSERT_OK(Open(&seen));
  EXPECT_THAT(seen, ElementsAre("snapshot", "z", "from-b"));
}

TEST_F(EtcdJournalTest, ADeposedLeaderCannotWriteAgain) {
  absl::Notification lost;
  absl::Status why;
  EtcdJournalOptions options = Options();
  options.on_leadership_lost = [&](const absl::Status& s) {
    why = s;
    lost.Notify();
  };
  std::vector<std::string> seen;
  auto j = Open(&seen, options);
  ASSERT_OK(j);
  ASSERT_OK((*j)->Append({Deleted("before")}));
  // Another coordinator's leader key replaces ours (as after our lease
  // expired while we were paused).
  Delete(Prefix() + "/leader");
  Put(Prefix() + "/leader", "coord-b:7070");
  EXPECT_THAT((*j)->Append({Deleted("after")}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("another coordinator leads")));
  ASSERT_TRUE(lost.HasBeenNotified());
  EXPECT_EQ(why.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Keys("log/").size(), 1u);  // "after" never landed
  EXPECT_THAT((*j)->leadership(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(EtcdJournalTest, ALostLeaseStepsDown) {
  absl::Notification lost;
  EtcdJournalOptions options = Options();
  options.on_leadership_lost = [&](const absl::Status&) { lost.Notify(); };
  std::vector<std::string> seen;
  auto j = Open(&seen, options);
  ASSERT_OK(j);
  auto lease = etcdserverpb::Lease::NewStub(channel_);
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id((*j)->lease_id());
  etcdserverpb::LeaseRevokeResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(lease->LeaseRevoke(&ctx, req, &resp).ok());
  lost.WaitForNotification();  // the next keep-alive finds the lease gone
  EXPECT_THAT((*j)->Append({Deleted("x")}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("expired")));
  EXPECT_TRUE(Keys("log/").empty());
}

TEST_F(EtcdJournalTest, APrefixHoldingOtherDataIsRefusedNamingTheKey) {
  Put(Prefix() + "/other", "x");
  std::vector<std::string> seen;
  EXPECT_THAT(Open(&seen), StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr(Prefix() + "/other")));
  Put(Prefix() + "/format", "sluice-journal 2");
  EXPECT_THAT(Open(&seen), StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr(Prefix() + "/format")));
  EXPECT_TRUE(Keys("leader").empty());  // refused before campaigning
}

TEST_F(EtcdJournalTest, UnreachableEtcdIsUnavailableNamingTheEndpoints) {
  EtcdJournalOptions options = Options();
  options.endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  options.connect_timeout = absl::Milliseconds(500);
  std::vector<std::string> seen;
  EXPECT_THAT(Open(&seen, options),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("127.0.0.1:1,127.0.0.1:2")));
}

TEST(EtcdJournalUrlTest, ParsesEndpointsAndPrefixAndNamesTheFlagOnError) {
  auto o = ParseEtcdJournalUrl(
      "etcd://10.0.0.1:2379,10.0.0.2:2379/sluice/prod/", "--journal");
  ASSERT_OK(o);
  EXPECT_THAT(o->endpoints, ElementsAre("10.0.0.1:2379", "10.0.0.2:2379"));
  EXPECT_EQ(o->prefix, "/sluice/prod");
  auto one = ParseEtcdJournalUrl("etcd://sluice-etcd:2379/sluice", "--journal");
  ASSERT_OK(one);
  EXPECT_THAT(one->endpoints, ElementsAre("sluice-etcd:2379"));
  for (const char* bad :
       {"http://a:1/p", "etcd://a:1", "etcd://a:1/", "etcd://a/p",
        "etcd://a:0/p", "etcd://,a:1/p", "etcd://a:99999/p",
        "etcd://10.0.0.1:2379,etcd-1:2379/p"}) {
    EXPECT_THAT(
        ParseEtcdJournalUrl(bad, "--journal"),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--journal=")))
        << bad;
  }
}

}  // namespace
}  // namespace sluice
