#include "server/coordinator/once_barrier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace sluice {
namespace {

using ::sluice::testing::FakeClock;
using ::sluice::testing::StatusIs;
using ::testing::HasSubstr;

class RecordingOnceSink : public OnceSink {
 public:
  void Send(const v1::OnceResponse& r) override { inbox.push_back(r); }
  void Finish(const absl::Status& s) override { finished = s; }
  std::vector<v1::OnceResponse> inbox;
  std::optional<absl::Status> finished;
};

v1::OnceRequest Join(const std::string& who, int64_t ttl_ms = 1000) {
  v1::OnceRequest r;
  r.mutable_join()->set_scope("job");
  r.mutable_join()->set_name("prep");
  r.mutable_join()->set_participant(who);
  r.mutable_join()->set_ttl_ms(ttl_ms);
  return r;
}

v1::OnceRequest Succeeded(int64_t run, const std::string& result) {
  v1::OnceRequest r;
  r.mutable_succeeded()->set_run(run);
  r.mutable_succeeded()->set_result(result);
  return r;
}

class OnceBarrierTest : public ::testing::Test {
 protected:
  OnceBarrierTest()
      : logic_([this] {
          OnceBarrier::Options o;
          o.clock = &clock_;
          o.persist = [this](const v1::internal::OnceFinished& f,
                             std::function<void(const absl::Status&)> done) {
            // What happens while the outcome is being journaled.
            if (during_persist_) {
              absl::Status s = during_persist_();
              if (!s.ok()) return done(s);
            }
            persisted_.push_back(f);
            done(absl::OkStatus());
          };
          o.find_finished = [this](const std::string&, const std::string&)
              -> std::optional<v1::internal::OnceFinished> {
            if (persisted_.empty()) return std::nullopt;
            return persisted_.back();
          };
          return o;
        }()) {}
  FakeClock clock_;
  std::vector<v1::internal::OnceFinished> persisted_;
  std::function<absl::Status()> during_persist_;
  OnceBarrier logic_;
};

// persist runs without the lock: while a success is being journaled, a
// caller can join (it waits, and hears the outcome) and status can be read.
TEST_F(OnceBarrierTest, ACallerJoiningWhileTheOutcomeIsJournaledHearsIt) {
  auto a = std::make_shared<RecordingOnceSink>();
  auto c = std::make_shared<RecordingOnceSink>();
  const int64_t ia = logic_.OpenOnce(a);
  logic_.OnOnceMessage(ia, Join("a"));
  ASSERT_TRUE(a->inbox[0].has_run());
  int64_t ic = 0;
  size_t running = 0;
  during_persist_ = [&] {
    ic = logic_.OpenOnce(c);
    logic_.OnOnceMessage(ic, Join("c"));
    running = logic_.Running("").size();
    // A second report of the same run while the first is journaled.
    logic_.OnOnceMessage(ia, Succeeded(1, "again"));
    return absl::OkStatus();
  };
  logic_.OnOnceMessage(ia, Succeeded(1, "/data"));
  EXPECT_EQ(running, 1u);
  ASSERT_EQ(c->inbox.size(), 2u);
  ASSERT_TRUE(c->inbox[0].has_wait());  // not a run of its own
  EXPECT_EQ(c->inbox[0].wait().runner(), "a");
  EXPECT_EQ(c->inbox[1].done().result(), "/data");
  EXPECT_OK(*c->finished);
  ASSERT_EQ(persisted_.size(), 1u);
  EXPECT_EQ(persisted_[0].result(), "/data");
  // The runner's duplicate report was refused; its stream ended there.
  EXPECT_THAT(*a->finished,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("run 1 already reported its outcome")));
}

TEST_F(OnceBarrierTest, ARunnerGoneWhileItsSuccessIsJournaledStartsNoNewRun) {
  auto a = std::make_shared<RecordingOnceSink>();
  auto b = std::make_shared<RecordingOnceSink>();
  const int64_t ia = logic_.OpenOnce(a), ib = logic_.OpenOnce(b);
  logic_.OnOnceMessage(ia, Join("a"));
  logic_.OnOnceMessage(ib, Join("b"));
  during_persist_ = [&] {
    logic_.CloseOnce(ia);  // its stream broke right after reporting
    clock_.Advance(absl::Seconds(5));
    logic_.Tick();  // nor does its lease expire meanwhile
    return absl::OkStatus();
  };
  logic_.OnOnceMessage(ia, Succeeded(1, "/data"));
  ASSERT_EQ(b->inbox.size(), 2u);
  ASSERT_TRUE(b->inbox[0].has_wait());
  EXPECT_EQ(b->inbox[1].done().result(), "/data");
  EXPECT_EQ(b->inbox[1].done().run(), 1);
}

TEST_F(OnceBarrierTest, ASuccessTheJournalRefusedHandsTheRunToTheNextWaiter) {
  auto a = std::make_shared<RecordingOnceSink>();
  auto b = std::make_shared<RecordingOnceSink>();
  const int64_t ia = logic_.OpenOnce(a), ib = logic_.OpenOnce(b);
  logic_.OnOnceMessage(ia, Join("a"));
  logic_.OnOnceMessage(ib, Join("b"));
  during_persist_ = [] { return absl::UnavailableError("journal: disk full"); };
  logic_.OnOnceMessage(ia, Succeeded(1, "/data"));
  EXPECT_TRUE(persisted_.empty());
  EXPECT_THAT(*a->finished,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk full")));
  ASSERT_TRUE(b->inbox.back().has_run());
  EXPECT_EQ(b->inbox.back().run().run(), 2);
  EXPECT_FALSE(b->finished.has_value());
}

TEST_F(OnceBarrierTest, SilentRunnerExpiresAndItsLateSuccessIsRefused) {
  auto a = std::make_shared<RecordingOnceSink>();
  auto b = std::make_shared<RecordingOnceSink>();
  int64_t ia = logic_.OpenOnce(a), ib = logic_.OpenOnce(b);
  logic_.OnOnceMessage(ia, Join("a"));
  logic_.OnOnceMessage(ib, Join("b"));
  ASSERT_TRUE(a->inbox[0].has_run());
  EXPECT_EQ(a->inbox[0].run().run(), 1);
  ASSERT_TRUE(b->inbox[0].has_wait());
  EXPECT_EQ(b->inbox[0].wait().runner(), "a");
  clock_.Advance(absl::Milliseconds(999));
  logic_.Tick();
  EXPECT_FALSE(a->finished.has_value());
  clock_.Advance(absl::Milliseconds(2));
  logic_.Tick();  // a's lease is over: b runs
  EXPECT_THAT(*a->finished,
              StatusIs(absl::StatusCode::kAborted, HasSubstr("expired")));
  ASSERT_TRUE(b->inbox.back().has_run());
  EXPECT_EQ(b->inbox.back().run().run(), 2);
  // a's late report names run 1: refused.
  logic_.OnOnceMessage(ia, Succeeded(1, "stale"));
  EXPECT_TRUE(persisted_.empty());
  logic_.OnOnceMessage(ib, Succeeded(2, "/data"));
  ASSERT_EQ(persisted_.size(), 1u);
  EXPECT_EQ(persisted_[0].run(), 2);
  EXPECT_EQ(b->inbox.back().done().result(), "/data");
  // A later caller gets Done without running.
  auto c = std::make_shared<RecordingOnceSink>();
  int64_t ic = logic_.OpenOnce(c);
  logic_.OnOnceMessage(ic, Join("c"));
  ASSERT_EQ(c->inbox.size(), 1u);
  EXPECT_EQ(c->inbox[0].done().result(), "/data");
  EXPECT_OK(*c->finished);
}

TEST_F(OnceBarrierTest, HeartbeatsKeepTheRun) {
  auto a = std::make_shared<RecordingOnceSink>();
  auto b = std::make_shared<RecordingOnceSink>();
  int64_t ia = logic_.OpenOnce(a), ib = logic_.OpenOnce(b);
  logic_.OnOnceMessage(ia, Join("a"));
  logic_.OnOnceMessage(ib, Join("b"));
  v1::OnceRequest beat;
  beat.mutable_heartbeat();
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Milliseconds(600));
    logic_.OnOnceMessage(ia, beat);
    logic_.Tick();
  }
  EXPECT_FALSE(a->finished.has_value());
  EXPECT_EQ(b->inbox.size(), 1u);  // still waiting
}

TEST_F(OnceBarrierTest, ATimedOutGenerationFailsEveryWaiterAndLateArrivals) {
  std::vector<absl::StatusOr<v1::BarrierResponse>> results;
  auto arrive = [&](const std::string& who, int64_t timeout_ms) {
    v1::BarrierRequest r;
    r.set_scope("job");
    r.set_name("ckpt");
    r.set_participant(who);
    r.set_participants(3);
    r.set_timeout_ms(timeout_ms);
    logic_.Barrier(r, [&](absl::StatusOr<v1::BarrierResponse> v) {
      results.push_back(v);
    });
  };
  arrive("rank-0", 100);
  arrive("rank-1", 1000);
  clock_.Advance(absl::Milliseconds(100));
  logic_.Tick();
  // rank-0's timeout fails generation 0 for both waiting ranks.
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_THAT(r.status(),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         HasSubstr("generation 0: 2 of 3 arrived")));
    EXPECT_THAT(r.status().message(), HasSubstr("1 missing: rank-2"));
  }
  // rank-2 comes late: it does not pass alone; it waits in generation 1,
  // where it is the only one, and times out naming the others.
  arrive("rank-2", 500);
  ASSERT_EQ(results.size(), 2u);
  clock_.Advance(absl::Milliseconds(500));
  logic_.Tick();
  ASSERT_EQ(results.size(), 3u);
  EXPECT_THAT(results[2].status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("generation 1: 1 of 3 arrived")));
  EXPECT_THAT(results[2].status().message(),
              HasSubstr("2 missing: rank-0, rank-1"));
  // All three again: generation 2 passes.
  arrive("rank-0", 1000);
  arrive("rank-1", 1000);
  arrive("rank-2", 1000);
  ASSERT_EQ(results.size(), 6u);
  ASSERT_OK(results[5].status());
  EXPECT_EQ(results[5]->generation(), 2);
  EXPECT_EQ(results[5]->arrived_size(), 3);
  // Disagreeing counts are an error naming the participant.
  v1::BarrierRequest bad;
  bad.set_scope("job");
  bad.set_name("ckpt");
  bad.set_participant("rank-0");
  bad.set_participants(3);
  logic_.Barrier(bad, [&](absl::StatusOr<v1::BarrierResponse> v) {
    results.push_back(v);
  });
  bad.set_participant("rank-1");
  bad.set_participants(5);
  logic_.Barrier(bad, [&](absl::StatusOr<v1::BarrierResponse> v) {
    results.push_back(v);
  });
  EXPECT_THAT(
      results.back().status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank-1 says 5")));
}

TEST_F(OnceBarrierTest, ACallerThatLeavesNoLongerCountsAsArrived) {
  std::map<std::string, std::vector<absl::StatusOr<v1::BarrierResponse>>>
      results;
  auto arrive = [&](const std::string& who, const std::string& call) {
    v1::BarrierRequest r;
    r.set_scope("job");
    r.set_name("ckpt-10");
    r.set_participant(who);
    r.set_participants(2);
    return logic_.Barrier(
        r, [&results, call](absl::StatusOr<v1::BarrierResponse> v) {
          results[call].push_back(v);
        });
  };
  // A run's rank 1 arrives and is killed inside the barrier.
  const int64_t dead = arrive("rank-1", "dead rank 1");
  ASSERT_NE(dead, 0);
  logic_.CancelBarrier(dead);
  ASSERT_EQ(results["dead rank 1"].size(), 1u);
  EXPECT_THAT(
      results["dead rank 1"][0].status(),
      StatusIs(absl::StatusCode::kCancelled,
               HasSubstr("barrier job/ckpt-10: participant rank-1 left")));
  logic_.CancelBarrier(dead);  // twice: a no-op
  EXPECT_EQ(results["dead rank 1"].size(), 1u);
  // The restarted run's rank 0 does not pass on the dead rank's arrival.
  const int64_t rank0 = arrive("rank-0", "rank 0");
  EXPECT_NE(rank0, 0);
  EXPECT_TRUE(results["rank 0"].empty());
  // The restarted rank 1 completes generation 0.
  EXPECT_EQ(arrive("rank-1", "rank 1"), 0);
  ASSERT_EQ(results["rank 0"].size(), 1u);
  ASSERT_OK(results["rank 0"][0].status());
  EXPECT_EQ(results["rank 0"][0]->generation(), 0);
  EXPECT_EQ(results["rank 0"][0]->arrived_size(), 2);
  ASSERT_EQ(results["rank 1"].size(), 1u);
  ASSERT_OK(results["rank 1"][0].status());
  logic_.CancelBarrier(rank0);  // already released: a no-op
  EXPECT_EQ(results["rank 0"].size(), 1u);

  // Generation 1: rank-1 waits twice (a stale call and its retry) and one
  // call leaves; the other keeps the arrival, so rank-0 completes the set.
  const int64_t first = arrive("rank-1", "g1 first");
  arrive("rank-1", "g1 second");
  logic_.CancelBarrier(first);
  EXPECT_THAT(results["g1 first"][0].status(),
              StatusIs(absl::StatusCode::kCancelled));
  arrive("rank-0", "g1 rank 0");
  ASSERT_EQ(results["g1 second"].size(), 1u);
  ASSERT_OK(results["g1 second"][0].status());
  EXPECT_EQ(results["g1 second"][0]->generation(), 1);
  ASSERT_OK(results["g1 rank 0"][0].status());
}

TEST_F(OnceBarrierTest, AnEmptiedGenerationTakesANewParticipantCount) {
  std::vector<absl::StatusOr<v1::BarrierResponse>> results;
  auto arrive = [&](const std::string& who, int32_t participants) {
    v1::BarrierRequest r;
    r.set_scope("job");
    r.set_name("resize");
    r.set_participant(who);
    r.set_participants(participants);
    return logic_.Barrier(r, [&](absl::StatusOr<v1::BarrierResponse> v) {
      results.push_back(v);
    });
  };
  // The only caller of a 4-way barrier leaves; the job comes back with 2.
  logic_.CancelBarrier(arrive("rank-0", 4));
  ASSERT_EQ(results.size(), 1u);
  arrive("rank-0", 2);
  arrive("rank-1", 2);
  ASSERT_EQ(results.size(), 3u);
  ASSERT_OK(results[2].status());
  EXPECT_EQ(results[2]->arrived_size(), 2);
}

// What one request can make the coordinator hold is bounded: participants
// (the missing list of a timeout once enumerated 2^31 ids), id lengths, and
// a Once result (64 KiB, as the proto says; a larger one was journaled and
// then failed every later caller with RESOURCE_EXHAUSTED).
TEST_F(OnceBarrierTest, RequestsBeyondTheLimitsAreRefusedNamingTheLimit) {
  std::vector<absl::StatusOr<v1::BarrierResponse>> results;
  v1::BarrierRequest r;
  r.set_scope("job");
  r.set_name("huge");
  r.set_participant("rank-0");
  r.set_participants(2147483647);
  logic_.Barrier(
      r, [&](absl::StatusOr<v1::BarrierResponse> v) { results.push_back(v); });
  ASSERT_EQ(results.size(), 1u);
  EXPECT_THAT(results[0].status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("[1, 100000]")));
  // The largest allowed count times out listing at most 1000 missing ids.
  r.set_participants(kMaxBarrierParticipants);
  r.set_timeout_ms(10);
  logic_.Barrier(
      r, [&](absl::StatusOr<v1::BarrierResponse> v) { results.push_back(v); });
  clock_.Advance(absl::Milliseconds(10));
  logic_.Tick();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_THAT(results[1].status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                            HasSubstr("99999 missing")));
  EXPECT_LT(results[1].status().message().size(), 20000u);
  r.set_participant(std::string(1 << 20, 'p'));
  r.set_participants(2);
  logic_.Barrier(
      r, [&](absl::StatusOr<v1::BarrierResponse> v) { results.push_back(v); });
  EXPECT_THAT(
      results.back().status(),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("barrier.participant is 1048576 bytes; the limit is 256")));

  auto a = std::make_shared<RecordingOnceSink>();
  const int64_t ia = logic_.OpenOnce(a);
  logic_.OnOnceMessage(ia, Join("a"));
  ASSERT_TRUE(a->inbox[0].has_run());
  logic_.OnOnceMessage(ia,
                       Succeeded(1, std::string(kMaxOnceResultBytes + 1, 'x')));
  EXPECT_TRUE(persisted_.empty());
  ASSERT_TRUE(a->finished.has_value());
  EXPECT_THAT(*a->finished,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("succeeded.result is 65537 bytes")));
  auto b = std::make_shared<RecordingOnceSink>();
  const int64_t ib = logic_.OpenOnce(b);
  logic_.OnOnceMessage(ib, Join(std::string(300, 'b')));
  ASSERT_TRUE(b->finished.has_value());
  EXPECT_THAT(*b->finished,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("once: join.participant is 300 bytes")));
}

// ("a/b", "c") and ("a", "b/c") are two barriers, not one; messages name
// them "scope/name". A scope holding a NUL byte is refused.
TEST_F(OnceBarrierTest, BarriersWhoseJoinedNamesMatchAreKeptApart) {
  std::vector<absl::StatusOr<v1::BarrierResponse>> results;
  auto arrive = [&](const std::string& scope, const std::string& name,
                    const std::string& who) {
    v1::BarrierRequest r;
    r.set_scope(scope);
    r.set_name(name);
    r.set_participant(who);
    r.set_participants(2);
    r.set_timeout_ms(1000);
    logic_.Barrier(r, [&](absl::StatusOr<v1::BarrierResponse> v) {
      results.push_back(std::move(v));
    });
  };
  arrive("a/b", "c", "rank-0");
  arrive("a", "b/c", "rank-1");
  EXPECT_TRUE(results.empty());  // one of two at each
  arrive("a/b", "c", "rank-1");
  ASSERT_EQ(results.size(), 2u);
  EXPECT_OK(results[0].status());
  EXPECT_OK(results[1].status());
  clock_.Advance(absl::Seconds(1));
  logic_.Tick();
  ASSERT_EQ(results.size(), 3u);
  EXPECT_THAT(results[2].status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("barrier a/b/c generation 0: 1 of 2 arrived "
                                 "within 1s (rank-1)")));
  arrive(std::string("x\0y", 3), "n", "rank-0");
  ASSERT_EQ(results.size(), 4u);
  EXPECT_THAT(results[3].status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("barrier.scope holds a NUL byte")));
}

TEST(OnceBarrierLimitsTest, BarrierParticipantsComeFromTheOptions) {
  FakeClock clock;
  OnceBarrier::Options o;
  o.clock = &clock;
  o.max_barrier_participants = 3;
  OnceBarrier logic(o);
  std::vector<absl::StatusOr<v1::BarrierResponse>> results;
  v1::BarrierRequest r;
  r.set_scope("job");
  r.set_name("b");
  r.set_participant("rank-0");
  r.set_participants(4);
  logic.Barrier(
      r, [&](absl::StatusOr<v1::BarrierResponse> v) { results.push_back(v); });
  ASSERT_EQ(results.size(), 1u);
  EXPECT_THAT(results[0].status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("[1, 3], got 4")));
}

// Running lists a step while it has a runner or waiters (with the runner's
// id and the waiters' count), per scope, and not once it has finished.
TEST_F(OnceBarrierTest, RunningListsStepsWithCallersInThem) {
  EXPECT_TRUE(logic_.Running("").empty());
  auto a = std::make_shared<RecordingOnceSink>();
  auto b = std::make_shared<RecordingOnceSink>();
  auto c = std::make_shared<RecordingOnceSink>();
  const int64_t ia = logic_.OpenOnce(a);
  const int64_t ib = logic_.OpenOnce(b);
  const int64_t ic = logic_.OpenOnce(c);
  logic_.OnOnceMessage(ia, Join("A"));
  logic_.OnOnceMessage(ib, Join("B"));
  logic_.OnOnceMessage(ic, Join("C"));
  std::vector<v1::OnceStep> running = logic_.Running("");
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].scope(), "job");
  EXPECT_EQ(running[0].name(), "prep");
  EXPECT_EQ(running[0].state(), v1::OnceStep::STATE_RUNNING);
  EXPECT_EQ(running[0].run(), 1);
  EXPECT_EQ(running[0].runner(), "A");
  EXPECT_EQ(running[0].waiting(), 2);
  EXPECT_EQ(logic_.Running("job").size(), 1u);
  EXPECT_TRUE(logic_.Running("other").empty());
  // A waiter leaving is not counted.
  logic_.CloseOnce(ic);
  EXPECT_EQ(logic_.Running("")[0].waiting(), 1);
  logic_.OnOnceMessage(ia, Succeeded(1, "/data/prep"));
  EXPECT_TRUE(logic_.Running("").empty());
}

}  // namespace
}  // namespace sluice
