#include "server/coordinator/granter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/fake_clock.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

bool NoneKept(int32_t) { return false; }
bool AllOffered(uint64_t) { return true; }

// A dynamic job of one rank read by `workers` readers over shards of 10
// samples at `urls`, its epoch 0 planned with 10 samples per reader.
JobData MakeJob(int32_t workers, const std::vector<std::string>& urls) {
  JobData job;
  job.spec.set_name("j");
  job.spec.set_mode(v1::MODE_DYNAMIC);
  job.spec.set_world_size(1);
  for (const std::string& url : urls) {
    v1::Shard* shard = job.spec.mutable_manifest()->add_shards();
    shard->set_url(url);
    shard->set_num_samples(10);
  }
  job.shard_samples = std::make_shared<std::vector<int64_t>>(urls.size(), 10);
  job.plan.num_ranks = 1;
  job.plan.workers_per_rank = workers;
  job.plan.samples_per_rank = 10 * workers;
  job.consumed_per_slot.assign(static_cast<size_t>(workers), 0);
  return job;
}

Piece MakePiece(int32_t shard, int64_t begin, int64_t end) {
  Piece p;
  p.sequence = shard;
  p.shard_index = shard;
  p.begin = begin;
  p.end = end;
  return p;
}

Session Reader(int32_t worker, const std::string& node = "") {
  Session s;
  s.hello = true;
  s.job = "j";
  s.worker = worker;
  s.node = node;
  s.trainer_id = "j/trainer-" + std::to_string(worker);
  return s;
}

class GranterTest : public ::testing::Test {
 protected:
  void Queue(const JobData& job, std::vector<Piece> pieces) {
    queues_.Rebuild(
        job, [&] { return pieces; }, AllOffered);
  }

  testing::FakeClock clock_;
  WorkQueues queues_;
  DataServerRegistry registry_{&clock_, absl::Seconds(3)};
  Granter granter_{&queues_, &registry_, &clock_, /*prefetch_hint_units=*/8};
};

TEST_F(GranterTest, AGrantIsCutAtTheReadersQuotaAndFencedAboveTheFloor) {
  JobData job = MakeJob(2, {"/d/0.tar", "/d/1.tar"});
  job.next_fence = 3;
  job.consumed_per_slot[1] = 4;  // worker 1 has 6 of its 10 left
  Queue(job, {MakePiece(0, 0, 10), MakePiece(1, 0, 10)});
  const auto next = granter_.Next(Reader(1), job, /*fence_floor=*/9, NoneKept);
  ASSERT_TRUE(std::holds_alternative<Granter::Grant>(next));
  const Granter::Grant& grant = std::get<Granter::Grant>(next);
  const auto& g = grant.record.lease_granted();
  EXPECT_EQ(g.job(), "j");
  EXPECT_EQ(g.worker(), 1);
  EXPECT_EQ(g.shard_index(), 0);
  EXPECT_EQ(g.begin(), 0);
  EXPECT_EQ(g.end(), 6);
  EXPECT_EQ(g.fence(), 9u);
  EXPECT_EQ(g.lease_id(), "j/e0/f9");
  EXPECT_EQ(g.holder(), "j/trainer-1");
  EXPECT_EQ(grant.data_server, "");  // none registered
  // The rest of the shard stays first in line.
  EXPECT_EQ(queues_.Upcoming(job, 1).front().begin, 6);

  job.next_fence = 12;
  const auto later = granter_.Next(Reader(0), job, 9, NoneKept);
  ASSERT_TRUE(std::holds_alternative<Granter::Grant>(later));
  EXPECT_EQ(std::get<Granter::Grant>(later).record.lease_granted().fence(),
            12u);
}

TEST_F(GranterTest, AReaderWaitsWithTheReasonItIsTold) {
  JobData job = MakeJob(2, {"/d/0.tar"});
  job.consumed_per_slot[1] = 10;
  Queue(job, {MakePiece(0, 0, 10)});
  auto next = granter_.Next(Reader(1), job, 1, NoneKept);
  ASSERT_TRUE(std::holds_alternative<Granter::Wait>(next));
  EXPECT_EQ(std::get<Granter::Wait>(next).kind, v1::WAITING_QUOTA_REACHED);
  EXPECT_EQ(std::get<Granter::Wait>(next).reason,
            "rank 0 worker 1 has its quota for epoch 0; waiting for the other "
            "readers to finish it");

  Queue(job, {});
  next = granter_.Next(Reader(0), job, 1, NoneKept);
  ASSERT_TRUE(std::holds_alternative<Granter::Wait>(next));
  EXPECT_EQ(std::get<Granter::Wait>(next).kind, v1::WAITING_NO_WORK_LEFT);
  EXPECT_EQ(std::get<Granter::Wait>(next).reason,
            "no unassigned work left in epoch 0 for rank 0 worker 0; waiting "
            "for held leases to complete");

  // Past the fence space: refused, with nothing to tell the reader.
  Queue(job, {MakePiece(0, 0, 10)});
  next = granter_.Next(Reader(0), job, uint64_t{1} << 63, NoneKept);
  ASSERT_TRUE(std::holds_alternative<Granter::Wait>(next));
  EXPECT_EQ(std::get<Granter::Wait>(next).reason, "");
  EXPECT_EQ(queues_.Upcoming(job, 0).size(), 1u);  // nothing taken
}

TEST_F(GranterTest, AGrantGoesToAServerOnTheReadersNodeUnlessItCannotReachIt) {
  registry_.Add("10.0.0.1:1", 1, nullptr, "node-a");
  registry_.Add("10.0.0.2:1", 1, nullptr, "node-b");
  JobData job = MakeJob(1, {"/d/0.tar", "/d/1.tar", "/d/2.tar"});
  Queue(job, {MakePiece(0, 0, 10), MakePiece(1, 0, 10), MakePiece(2, 0, 10)});
  Session reader = Reader(0, "node-b");
  auto next = granter_.Next(reader, job, 1, NoneKept);
  ASSERT_TRUE(std::holds_alternative<Granter::Grant>(next));
  EXPECT_EQ(std::get<Granter::Grant>(next).data_server, "10.0.0.2:1");
  EXPECT_TRUE(std::get<Granter::Grant>(next).same_node);

  reader.unreachable.Failed("10.0.0.2:1", clock_.Now());
  job.consumed_per_slot[0] = 0;
  next = granter_.Next(reader, job, 1, NoneKept);
  ASSERT_TRUE(std::holds_alternative<Granter::Grant>(next));
  EXPECT_EQ(std::get<Granter::Grant>(next).data_server, "10.0.0.1:1");
  EXPECT_FALSE(std::get<Granter::Grant>(next).same_node);
}

// A dynamic job's grant is steered to a shard another job reads now (within
// the lookahead); without another job's lease, or for a static job, the
// front piece is granted.
TEST_F(GranterTest, AGrantPrefersAShardAnotherJobIsReading) {
  LeaseTable leases(&clock_);
  Granter steering(&queues_, &registry_, &clock_, 0, &leases);
  std::vector<std::string> urls;
  for (int i = 0; i < 5; ++i) urls.push_back(absl::StrCat("/d/", i, ".tar"));
  JobData job = MakeJob(1, urls);
  job.plan.samples_per_rank = 50;
  std::vector<Piece> pieces;
  for (int i = 0; i < 5; ++i) pieces.push_back(MakePiece(i, 0, 10));
  auto granted_shard = [&](Granter& granter, const JobData& j) {
    Queue(j, pieces);
    auto next = granter.Next(Reader(0), j, 1, NoneKept);
    EXPECT_TRUE(std::holds_alternative<Granter::Grant>(next));
    if (!std::holds_alternative<Granter::Grant>(next)) return -1;
    return std::get<Granter::Grant>(next).record.lease_granted().shard_index();
  };
  EXPECT_EQ(granted_shard(steering, job), 0);  // no other job reads

  LeaseEntry other;
  other.lease_id = "other/e0/f1";
  other.fence = 1;
  other.job = "other";
  other.holder = "other/t0";
  other.shard_url = "/d/3.tar";
  other.begin = 5;
  other.end = 10;
  ASSERT_TRUE(leases.Add(other, absl::Seconds(10)).ok());
  EXPECT_EQ(granted_shard(steering, job), 3);
  EXPECT_EQ(queues_.Upcoming(job, 0).front().shard_index, 0);  // still first
  EXPECT_EQ(granted_shard(granter_, job), 0);  // a granter without leases

  JobData fixed = job;  // a static job keeps its plan's order
  fixed.spec.set_mode(v1::MODE_STATIC);
  fixed.spec.set_world_size(0);
  EXPECT_EQ(granted_shard(steering, fixed), 0);
}

// Records the hints a data server is sent.
class HintSink : public DataServerSink {
 public:
  void Send(const v1::CoordinatorToDataServer& m) override {
    for (const v1::Shard& shard : m.prefetch().shards())
      urls.push_back(shard.url());
  }
  std::vector<std::string> urls;
};

TEST_F(GranterTest, HintsNameEachRemoteShardAheadOnce) {
  auto sink = std::make_shared<HintSink>();
  registry_.Add("10.0.0.1:1", 1, sink);
  JobData job = MakeJob(1, {"http://h/0.tar", "/d/1.tar", "http://h/2.tar"});
  Queue(job, {MakePiece(0, 0, 10), MakePiece(1, 0, 10), MakePiece(2, 0, 10)});
  Effects fx;
  granter_.Hints(job, 0, fx);
  ASSERT_EQ(fx.hints.size(), 1u);
  fx.hints[0].first->Send(fx.hints[0].second);
  EXPECT_THAT(sink->urls, ElementsAre("http://h/0.tar", "http://h/2.tar"));
  // Hinted already: not again.
  Effects again;
  granter_.Hints(job, 0, again);
  EXPECT_THAT(again.hints, IsEmpty());
}

}  // namespace
}  // namespace sluice
