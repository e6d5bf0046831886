#include "server/coordinator/durable_outbox.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/testing/gated_journal.h"

namespace sluice {
namespace {

using ::sluice::testing::GatedJournal;

// Records what reaches it, as "send:<lease>" and "finish:<code>".
class RecordingSink final : public SessionSink {
 public:
  void Send(v1::CoordinatorMessage m) override {
    absl::MutexLock lock(&mu_);
    log_.push_back("send:" + m.grant().lease().lease_id());
  }
  void Finish(const absl::Status& s) override {
    absl::MutexLock lock(&mu_);
    log_.push_back(std::string("finish:") + absl::StatusCodeToString(s.code()) +
                   ":" + std::string(s.message()));
  }
  std::vector<std::string> log() const {
    absl::MutexLock lock(&mu_);
    return log_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

class DurableOutboxTest : public ::testing::Test {
 protected:
  // Effects granting `lease` to the sink, depending on a new record when
  // `journaled`.
  Effects Grant(const std::string& lease, bool journaled = true) {
    Effects fx;
    v1::CoordinatorMessage m;
    m.mutable_grant()->mutable_lease()->set_lease_id(lease);
    fx.sends.emplace_back(sink_, m);
    if (journaled) fx.ticket = journal_.Enqueue(JournalRecord());
    return fx;
  }

  GatedJournal journal_;
  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
};

TEST_F(DurableOutboxTest, NothingLeavesBeforeItsRecordIsDurable) {
  DurableOutbox outbox(&journal_, nullptr);
  outbox.Submit(Grant("a"));
  outbox.DeliverReady();
  EXPECT_THAT(sink_->log(), ::testing::IsEmpty());
  journal_.MakeDurable(1);
  outbox.Flush();
  EXPECT_THAT(sink_->log(), ::testing::ElementsAre("send:a"));
}

TEST_F(DurableOutboxTest, AlreadyDurableEffectsLeaveOnTheCallersThread) {
  journal_.MakeDurable(100);
  DurableOutbox outbox(&journal_, nullptr);
  outbox.Submit(Grant("a"));
  outbox.DeliverReady();
  EXPECT_THAT(sink_->log(), ::testing::ElementsAre("send:a"));
}

TEST_F(DurableOutboxTest, EffectsWithoutRecordsWaitForEveryRecordBeforeThem) {
  DurableOutbox outbox(&journal_, nullptr);
  outbox.Submit(Grant("a"));  // record 1
  outbox.Submit(
      Grant("synced", /*journaled=*/false));  // depends on nothing new
  outbox.DeliverReady();
  EXPECT_THAT(sink_->log(), ::testing::IsEmpty());
  journal_.MakeDurable(1);
  outbox.Flush();
  EXPECT_THAT(sink_->log(), ::testing::ElementsAre("send:a", "send:synced"));
}

TEST_F(DurableOutboxTest, OneGroupCommitDeliversEverythingInSubmitOrder) {
  DurableOutbox outbox(&journal_, nullptr);
  outbox.Submit(Grant("a"));
  journal_.AwaitWaiter();  // the flusher waits for record 1 ...
  outbox.Submit(Grant("b"));
  outbox.Submit(Grant("c"));
  journal_.MakeDurable(3);  // ... and then everything up to 3 is durable
  outbox.Flush();
  EXPECT_THAT(sink_->log(),
              ::testing::ElementsAre("send:a", "send:b", "send:c"));
}

// Blocks in Send of lease "a" until released; notes the arrival of "b".
class GateSink final : public SessionSink {
 public:
  void Send(v1::CoordinatorMessage m) override {
    if (m.grant().lease().lease_id() == "a") {
      in_send_.Notify();
      release_.WaitForNotification();
    } else if (m.grant().lease().lease_id() == "b") {
      got_b_.Notify();
    }
  }
  void Finish(const absl::Status&) override {}
  absl::Notification in_send_, release_, got_b_;
};

TEST_F(DurableOutboxTest, WhatBecomesDurableWhileTheFlusherDeliversLeavesToo) {
  auto gate = std::make_shared<GateSink>();
  DurableOutbox outbox(&journal_, nullptr);
  Effects a;
  a.sends.emplace_back(gate, v1::CoordinatorMessage());
  a.sends.back().second.mutable_grant()->mutable_lease()->set_lease_id("a");
  a.ticket = journal_.Enqueue(JournalRecord());
  outbox.Submit(std::move(a));
  journal_.AwaitWaiter();  // the flusher waits for record 1
  journal_.MakeDurable(1);
  gate->in_send_.WaitForNotification();  // the flusher is delivering "a"
  Effects b;
  b.sends.emplace_back(gate, v1::CoordinatorMessage());
  b.sends.back().second.mutable_grant()->mutable_lease()->set_lease_id("b");
  b.ticket = journal_.Enqueue(JournalRecord());
  outbox.Submit(std::move(b));
  journal_.MakeDurable(2);  // durable through another thread's wait
  outbox.DeliverReady();    // returns at once: the flusher is delivering
  gate->release_.Notify();
  // Without a further DeliverReady: the flusher itself sends "b".
  EXPECT_TRUE(gate->got_b_.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

TEST_F(DurableOutboxTest, AFailedWriteEndsTheSessionsInsteadOfSending) {
  auto other = std::make_shared<RecordingSink>();
  DurableOutbox outbox(&journal_, nullptr);
  Effects fx = Grant("a");
  v1::CoordinatorMessage m;
  m.mutable_grant()->mutable_lease()->set_lease_id("a2");
  fx.sends.emplace_back(sink_, m);  // a second message to the same session
  fx.sends.emplace_back(other, m);
  outbox.Submit(std::move(fx));
  journal_.Fail(absl::InternalError("disk full"));
  outbox.Flush();
  EXPECT_THAT(sink_->log(),
              ::testing::ElementsAre(
                  "finish:UNAVAILABLE:coordinator journal failed: disk full"));
  EXPECT_THAT(other->log(),
              ::testing::ElementsAre(
                  "finish:UNAVAILABLE:coordinator journal failed: disk full"));
}

TEST_F(DurableOutboxTest, EffectsWithNothingToSendAndNoRecordAreDropped) {
  DurableOutbox outbox(&journal_, nullptr);
  outbox.Submit(Effects());
  outbox.Flush();  // returns: nothing was queued
  EXPECT_THAT(sink_->log(), ::testing::IsEmpty());
}

TEST_F(DurableOutboxTest, DestroyingTheOutboxDeliversWhatIsLeftOnceDurable) {
  {
    DurableOutbox outbox(&journal_, nullptr);
    outbox.Submit(Grant("a"));
    journal_.AwaitWaiter();
    journal_.MakeDurable(1);
  }
  EXPECT_THAT(sink_->log(), ::testing::ElementsAre("send:a"));
}

}  // namespace
}  // namespace sluice
