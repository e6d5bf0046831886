// Audit: the samples each reader acknowledged in an epoch, in order, as the
// coordinator names them (server/coordinator/audit.h).
#include "server/coordinator/audit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/lease_token.h"
#include "server/coordinator/coordinator_service.h"
#include "tests/testing/coordinator_fixture.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::CoordinatorServiceTest;
using ::sluice::testing::CreateJournaled;
using ::sluice::testing::FakeClock;
using ::sluice::testing::JournaledOptions;
using ::sluice::testing::MakeCursor;
using ::sluice::testing::SimTrainer;
using ::sluice::testing::Spec;
using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

using Ledger = std::vector<std::tuple<int64_t, int32_t, int64_t>>;

v1::AuditRequest Ask(const std::string& job, int64_t epoch, int32_t rank,
                     int64_t start = 0, int64_t count = 0) {
  v1::AuditRequest r;
  r.set_job(job);
  r.set_epoch(epoch);
  r.set_rank(rank);
  r.set_start(start);
  r.set_count(count);
  return r;
}

// The audit as (epoch, shard, index) triples, checking positions, URLs and
// the unit kind on the way.
Ledger AsLedger(const v1::AuditResponse& audit, int64_t start = 0) {
  Ledger out;
  for (const v1::AuditedSample& s : audit.samples()) {
    EXPECT_EQ(s.position(), start + static_cast<int64_t>(out.size()));
    EXPECT_EQ(s.shard_url(),
              "/data/shard-" + std::to_string(s.shard_index()) + ".tar");
    EXPECT_EQ(s.unit_kind(), "shard");
    out.emplace_back(audit.epoch(), s.shard_index(), s.index());
  }
  return out;
}

Ledger OfEpoch(const Ledger& all, int64_t epoch) {
  Ledger out;
  for (const auto& s : all)
    if (std::get<0>(s) == epoch) out.push_back(s);
  return out;
}

// Two ranks of a dynamic job take units first come, first served; each
// rank's audit of each kept epoch is what it consumed, in its order.
TEST_F(CoordinatorServiceTest, AnAuditIsWhatEachRankConsumedInOrder) {
  v1::JobSpec spec = Spec("j", {7, 5, 9, 4, 6}, 2, 3);  // q = 15
  spec.set_mode(v1::MODE_DYNAMIC);
  spec.set_max_samples_per_lease(4);
  ASSERT_OK(service_->CreateJob(spec));
  SimTrainer a(*service_, "j", 0, "a"), b(*service_, "j", 1, "b");
  for (int round = 0; round < 8; ++round) {  // epoch 0, and 2 of epoch 1
    a.Consume(round % 3 + 1);
    b.Consume(2);
  }
  ASSERT_EQ(OfEpoch(a.consumed, 0).size(), 15u);
  ASSERT_EQ(OfEpoch(b.consumed, 0).size(), 15u);
  for (int64_t epoch : {0, 1}) {
    for (SimTrainer* t : {&a, &b}) {
      const int rank = t == &a ? 0 : 1;
      absl::StatusOr<v1::AuditResponse> audit =
          service_->Audit(Ask("j", epoch, rank));
      ASSERT_OK(audit);
      EXPECT_EQ(audit->total(), OfEpoch(t->consumed, epoch).size());
      EXPECT_EQ(AsLedger(*audit), OfEpoch(t->consumed, epoch))
          << "rank " << rank << " epoch " << epoch;
      EXPECT_THAT(audit->epochs_kept(), ::testing::ElementsAre(0, 1));
      EXPECT_EQ(audit->workers_per_rank(), 1);
    }
  }
  // A page from the middle.
  absl::StatusOr<v1::AuditResponse> page =
      service_->Audit(Ask("j", 0, 1, 6, 5));
  ASSERT_OK(page);
  const Ledger all = OfEpoch(b.consumed, 0);
  EXPECT_EQ(AsLedger(*page, 6), Ledger(all.begin() + 6, all.begin() + 11));
  EXPECT_EQ(page->total(), 15);
  // Past the end: none, and the total.
  page = service_->Audit(Ask("j", 0, 1, 40, 5));
  ASSERT_OK(page);
  EXPECT_EQ(page->samples_size(), 0);
  EXPECT_EQ(page->total(), 15);
}

TEST_F(CoordinatorServiceTest, BadAuditsGetTheDocumentedCodes) {
  ASSERT_OK(service_->CreateJob(Spec("j", {7, 5}, 2, 1)));
  EXPECT_THAT(service_->Audit(Ask("nope", 0, 0)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("\"nope\"")));
  EXPECT_THAT(service_->Audit(Ask("j", 3, 0)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("audit.epoch=3 is not kept; the job keeps "
                                 "epoch(s) 0")));
  EXPECT_THAT(service_->Audit(Ask("j", 0, 2)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("audit.rank=2 is not within [0, 2)")));
  v1::AuditRequest worker = Ask("j", 0, 0);
  worker.set_worker(1);
  EXPECT_THAT(service_->Audit(worker),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("audit.worker=1")));
  EXPECT_THAT(service_->Audit(Ask("j", 0, 0, -1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("audit.start=-1")));
  EXPECT_THAT(service_->Audit(Ask("j", 0, 0, 0, kAuditMaxCount + 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("audit.count=10001")));
  // A job done keeps its last epoch only.
  SimTrainer a(*service_, "j", 0, "a"), b(*service_, "j", 1, "b");
  ASSERT_EQ(a.Consume(6), 6);
  ASSERT_EQ(b.Consume(6), 6);
  absl::StatusOr<v1::AuditResponse> last = service_->Audit(Ask("j", 0, 1));
  ASSERT_OK(last);
  EXPECT_EQ(AsLedger(*last), b.consumed);
  EXPECT_THAT(last->epochs_kept(), ::testing::ElementsAre(0));
  EXPECT_THAT(service_->Audit(Ask("j", 1, 0)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

// A resume keeps the prefix its cursor counted; what the resumed reader
// takes follows it. Its audit then survives a restart and a compaction.
TEST(CoordinatorAuditTest, AResumedRankIsAuditedFromItsCursorOn) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock);
  options.journal_compact_bytes = 1024;  // compacted mid-epoch
  const v1::Cursor cursor = MakeCursor("j", 0, 2, {4, 3});
  Ledger want_a, want_b, rolled_a, rolled_b;
  {
    auto created = CreateJournaled(options, dir.path());
    ASSERT_OK(created);
    v1::JobSpec spec = Spec("j", {10, 10}, 2, 2);  // q = 10
    spec.set_max_samples_per_lease(3);
    ASSERT_OK((*created)->CreateJob(spec));
    SimTrainer a(**created, "j", 0, "a"), b(**created, "j", 1, "b");
    ASSERT_EQ(a.Consume(7), 7);
    ASSERT_EQ(b.Consume(5), 5);
    SimTrainer a2(**created, "j", 0, "a2", &cursor);
    SimTrainer b2(**created, "j", 1, "b2", &cursor);
    ASSERT_EQ(a2.Consume(6), 6);
    ASSERT_EQ(b2.Consume(7), 7);
    rolled_a.assign(a.consumed.begin() + 4, a.consumed.end());
    rolled_b.assign(b.consumed.begin() + 3, b.consumed.end());
    // A static job: the resumed ranks read their own cut-off samples first.
    ASSERT_EQ(Ledger(a2.consumed.begin(), a2.consumed.begin() + 3), rolled_a);
    ASSERT_EQ(Ledger(b2.consumed.begin(), b2.consumed.begin() + 2), rolled_b);
    want_a.assign(a.consumed.begin(), a.consumed.begin() + 4);
    want_a.insert(want_a.end(), a2.consumed.begin(), a2.consumed.end());
    want_b.assign(b.consumed.begin(), b.consumed.begin() + 3);
    want_b.insert(want_b.end(), b2.consumed.begin(), b2.consumed.end());
    auto audit = (*created)->Audit(Ask("j", 0, 0));
    ASSERT_OK(audit);
    EXPECT_EQ(AsLedger(*audit), want_a);
    EXPECT_GE((*created)->WaitForCompactions(), 1);
  }
  auto reopened = CreateJournaled(options, dir.path());
  ASSERT_OK(reopened);
  auto a = (*reopened)->Audit(Ask("j", 0, 0));
  auto b = (*reopened)->Audit(Ask("j", 0, 1));
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(AsLedger(*a), want_a);
  EXPECT_EQ(AsLedger(*b), want_b);
  // What the resume cut off: each rank's samples past the cursor. The
  // resumed ranks read exactly those first (a static job), marked reread.
  v1::AuditRequest cut = Ask("j", 0, 0);
  cut.set_rolled_back(true);
  auto cut_a = (*reopened)->Audit(cut);
  cut.set_rank(1);
  auto cut_b = (*reopened)->Audit(cut);
  ASSERT_OK(cut_a);
  ASSERT_OK(cut_b);
  EXPECT_EQ(AsLedger(*cut_a), rolled_a);
  EXPECT_EQ(AsLedger(*cut_b), rolled_b);
  EXPECT_EQ(cut_a->total(), 3);
  for (const auto& [audit, cut_off] :
       {std::pair{&*a, &rolled_a}, std::pair{&*b, &rolled_b}}) {
    const int kept = audit == &*a ? 4 : 3;
    for (int i = 0; i < audit->samples_size(); ++i) {
      const bool again =
          i >= kept && i < kept + static_cast<int>(cut_off->size());
      EXPECT_EQ(audit->samples(i).reread(), again) << "position " << i;
    }
  }
}

// Asked for, each sample comes with a lease of that one sample, signed as
// a grant is and valid for kReplayLeaseTtl, keyed by the job's seed.
TEST(CoordinatorAuditTest, ReplayLeasesCoverOneSampleEachAndAreSigned) {
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock);
  options.lease_secret = "s3cret";
  auto service = CoordinatorService::Create(options);
  ASSERT_OK(service);
  v1::JobSpec spec = Spec("j", {6, 4}, 1, 1);
  spec.mutable_manifest()->mutable_shards(1)->set_size_bytes(4096);
  const std::string checksum = "sha256:" + std::string(64, 'a');
  spec.mutable_manifest()->mutable_shards(1)->set_checksum(checksum);
  ASSERT_OK((*service)->CreateJob(spec));
  SimTrainer t(**service, "j", 0, "t");
  ASSERT_EQ(t.Consume(10), 10);
  v1::AuditRequest ask = Ask("j", 0, 0, 2, 6);
  ask.set_replay_leases(true);
  absl::StatusOr<v1::AuditResponse> audit = (*service)->Audit(ask);
  ASSERT_OK(audit);
  ASSERT_EQ(audit->samples_size(), 6);
  for (const v1::AuditedSample& s : audit->samples()) {
    const v1::Lease& l = s.replay_lease();
    EXPECT_OK(VerifyLeaseToken(l, "s3cret"));
    EXPECT_EQ(l.job(), "j");
    EXPECT_EQ(l.epoch(), 0);
    EXPECT_EQ(l.augment_seed(), 5u);
    EXPECT_EQ(s.augment_seed(), 5u);
    EXPECT_EQ(l.expires_at_unix_ms(),
              absl::ToUnixMillis(clock.Now() + kReplayLeaseTtl));
    ASSERT_TRUE(l.unit().has_shard());
    EXPECT_EQ(l.unit().shard().url(), s.shard_url());
    EXPECT_EQ(l.unit().shard().shard_index(), s.shard_index());
    EXPECT_EQ(l.unit().begin(), s.index());
    EXPECT_EQ(l.unit().end(), s.index() + 1);
    EXPECT_EQ(l.unit().sequence(), s.sequence());
    if (s.shard_index() == 1) {
      EXPECT_EQ(l.unit().shard().size_bytes(), 4096);
      EXPECT_EQ(l.unit().shard().checksum(), checksum);
    }
    EXPECT_THAT(l.lease_id(), ::testing::StartsWith(absl::StrCat(
                                  "replay/j/e0/r0w0/p", s.position())));
  }
  // Without asking, none.
  audit = (*service)->Audit(Ask("j", 0, 0, 2, 6));
  ASSERT_OK(audit);
  EXPECT_FALSE(audit->samples(0).has_replay_lease());
}

}  // namespace
}  // namespace sluice
