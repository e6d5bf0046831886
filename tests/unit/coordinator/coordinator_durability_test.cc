// CoordinatorService: What the journal keeps: reports that wait for it, replay
// after a restart, compaction.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "server/common/lease_token.h"
#include "server/coordinator/coordinator_metrics.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/memory_journal.h"
#include "tests/testing/coordinator_fixture.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/gated_journal.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sluice {
namespace {

using ::sluice::testing::Complete;
using ::sluice::testing::CreateJournaled;
using ::sluice::testing::FakeClock;
using ::sluice::testing::Hello;
using ::sluice::testing::JournaledOptions;
using ::sluice::testing::MakeCursor;
using ::sluice::testing::OpenAndWantOne;
using ::sluice::testing::Progress;
using ::sluice::testing::RecordingSink;
using ::sluice::testing::SimTrainer;
using ::sluice::testing::Spec;
using ::sluice::testing::StatusIs;
using ::sluice::testing::Want;
using ::testing::HasSubstr;

// GetJob and ListJobs report state a crash cannot undo: an acknowledged
// Complete shows in them only once its journal record is durable, and a
// failed journal makes them UNAVAILABLE instead of reporting it. The
// answers wait in the outbox, not on their caller's thread.
TEST(CoordinatorDurabilityTest, JobReportsWaitForTheRecordsTheyInclude) {
  FakeClock clock;
  testing::GatedJournal* journal = nullptr;
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  RecoveredJournal gated;
  gated.journal = std::make_unique<testing::GatedJournal>();
  journal = static_cast<testing::GatedJournal*>(gated.journal.get());
  auto created = CoordinatorService::Create(options, std::move(gated));
  ASSERT_OK(created);
  std::unique_ptr<CoordinatorService> service = std::move(*created);
  journal->MakeDurable(1);  // the job's creation
  ASSERT_OK(service->CreateJob(Spec("j", {10}, 0, 1)));
  auto a = std::make_shared<RecordingSink>();
  const int64_t id = service->OpenSession(a);
  service->OnMessage(id, Hello("j", 0, "t"));
  service->OnMessage(id, Want(1));
  journal->MakeDurable(journal->LastTicket());  // the grant
  service->Flush();
  const std::vector<v1::Lease> grants = a->TakeGrants();
  ASSERT_EQ(grants.size(), 1u);
  const int waits = journal->waits();
  service->OnMessage(id, Progress(grants[0], 4));  // journaled, not durable
  journal->AwaitWaits(waits + 1);                  // the outbox's flusher

  // GetJob answers through the outbox: its caller does not wait, and the
  // answer waits for the Progress record.
  absl::StatusOr<v1::Job> reported;
  absl::Notification answered;
  service->GetJob("j", false, [&](absl::StatusOr<v1::Job> job) {
    reported = std::move(job);
    answered.Notify();
  });
  EXPECT_FALSE(answered.HasBeenNotified());
  journal->MakeDurable(journal->LastTicket());
  service->Flush();
  EXPECT_TRUE(answered.HasBeenNotified());
  ASSERT_OK(reported);
  EXPECT_EQ(reported->status().consumed_in_epoch(), 4);

  // So does CreateJob, for its record.
  absl::StatusOr<v1::Job> created_k;
  absl::Notification k_answered;
  service->CreateJob(Spec("k", {5}, 0, 1), [&](absl::StatusOr<v1::Job> job) {
    created_k = std::move(job);
    k_answered.Notify();
  });
  EXPECT_FALSE(k_answered.HasBeenNotified());
  journal->MakeDurable(journal->LastTicket());
  service->Flush();
  EXPECT_TRUE(k_answered.HasBeenNotified());
  ASSERT_OK(created_k);
  EXPECT_EQ(created_k->spec().name(), "k");

  service->OnMessage(id, Progress(grants[0], 6));
  journal->Fail(absl::DataLossError("disk gone"));
  EXPECT_THAT(service->GetJob("j", false).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk gone")));
  EXPECT_THAT(service->ListJobs().status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk gone")));
}

// A coordinator that starts leading over live leases (a restart, an HA
// takeover) keeps each one for its TTL and the reconnect grace: the holder
// may notice only now that its coordinator is gone. A holder that never
// comes back loses the lease after exactly that.
TEST(CoordinatorRecoveryTest,
     ARecoveredLeaseWaitsTheReconnectGraceForItsHolder) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock);
  options.wait_for_data_servers = false;
  v1::JobSpec spec = Spec("j", {5, 5}, 1, 1);
  spec.set_lease_ttl_ms(2000);
  {
    auto service = CreateJournaled(options, dir.path());
    ASSERT_OK(service);
    ASSERT_OK((*service)->CreateJob(spec));
    auto sink = std::make_shared<RecordingSink>();
    OpenAndWantOne(**service, sink);
    (*service)->Flush();
    ASSERT_EQ(sink->TakeGrants().size(), 1u);
  }
  auto service = CreateJournaled(options, dir.path());
  ASSERT_OK(service);
  clock.Advance(absl::Seconds(2) + kReconnectGrace - absl::Milliseconds(1));
  EXPECT_EQ((*service)->ExpireLeases(), 0);
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ((*service)->ExpireLeases(), 1);
}

// Replaying the journal yields the live state: same status, same leases.
TEST(CoordinatorRecoveryTest, ReplayEqualsLiveState) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock);
  v1::Job before;
  std::string held_lease;
  {
    auto service = CreateJournaled(options, dir.path());
    ASSERT_OK(service);
    v1::JobSpec spec = Spec("j", {5, 5, 5}, 3, 2);
    spec.set_max_samples_per_lease(2);
    ASSERT_OK((*service)->CreateJob(spec));
    auto sink = std::make_shared<RecordingSink>();
    const int64_t id = (*service)->OpenSession(sink);
    (*service)->OnMessage(id, Hello("j", 1, "t1"));
    (*service)->OnMessage(id, Want(2));
    (*service)->Flush();
    std::vector<v1::Lease> grants = sink->TakeGrants();
    ASSERT_EQ(grants.size(), 2u);
    (*service)->OnMessage(id, Complete(grants[0]));
    (*service)->OnMessage(id, Progress(grants[1], 1));
    (*service)->Flush();
    held_lease = grants[1].lease_id();
    before = *(*service)->GetJob("j", false);
    // Sessions and lease counts are not durable state.
    before.mutable_status()->mutable_ranks(1)->clear_sessions();
    before.mutable_status()->clear_leases();
  }
  auto service = CreateJournaled(options, dir.path());
  ASSERT_OK(service);
  EXPECT_GT((*service)->recovered_records(), 0);
  v1::Job after = *(*service)->GetJob("j", false);
  EXPECT_EQ(after.status().leases().granted(), 0);  // counted from start-up
  after.mutable_status()->clear_leases();
  EXPECT_EQ(after.status().DebugString(), before.status().DebugString());
  // The recovered lease has a fresh TTL and is handed back to its holder.
  auto sink = std::make_shared<RecordingSink>();
  const int64_t id = (*service)->OpenSession(sink);
  (*service)->OnMessage(id, Hello("j", 1, "t1"));
  (*service)->Flush();
  // Both leases it held (the progressed one and the one granted for the
  // credit its Complete freed) come back, each with a fresh TTL.
  std::vector<v1::Lease> again = sink->TakeGrants();
  ASSERT_EQ(again.size(), 2u);
  EXPECT_TRUE(again[0].lease_id() == held_lease ||
              again[1].lease_id() == held_lease);
  for (const v1::Lease& l : again) {
    EXPECT_EQ(l.expires_at_unix_ms(), absl::ToUnixMillis(clock.Now()) + 2000);
  }
}

// With a tiny compaction threshold the journal is replaced by snapshots
// again and again during three epochs, a resume and live leases; it stays
// small, starts with a Snapshot, and a restart rebuilds the same state
// (leases, counts, the kept previous epoch, the resume) as the live server.
TEST(CoordinatorCompactionTest, SnapshotsKeepTheJournalSmallAndReplayExactly) {
  testing::TempDir dir;
  FakeClock clock;
  CoordinatorOptions options = JournaledOptions(&clock);
  options.journal_compact_bytes = 4096;
  std::string before;
  std::set<std::string> held;
  {
    auto created = CreateJournaled(options, dir.path());
    ASSERT_OK(created);
    CoordinatorService& service = **created;
    v1::JobSpec spec = Spec("j", {40, 25, 35}, 2, 4);  // q = 50
    spec.set_max_samples_per_lease(7);
    ASSERT_OK(service.CreateJob(spec));
    SimTrainer a(service, "j", 0, "a"), b(service, "j", 1, "b");
    ASSERT_EQ(a.Consume(50), 50);
    ASSERT_EQ(b.Consume(50), 50);
    ASSERT_EQ(a.Consume(31), 31);  // epoch 1
    ASSERT_EQ(b.Consume(12), 12);
    // Resume into epoch 0, then consume into epoch 1 again.
    const v1::Cursor cursor = MakeCursor("j", 0, 2, {44, 9});
    SimTrainer a2(service, "j", 0, "a2", &cursor),
        b2(service, "j", 1, "b2", &cursor);
    ASSERT_EQ(b2.Consume(41), 41);
    ASSERT_EQ(a2.Consume(6 + 20), 26);
    ASSERT_EQ(b2.Consume(3), 3);
    for (const v1::Lease& l : a2.held) held.insert(l.lease_id());
    for (const v1::Lease& l : b2.held) held.insert(l.lease_id());
    v1::JobStatus status = service.GetJob("j", false)->status();
    status.clear_leases();  // counted since start-up, not journaled
    before = status.DebugString();
  }
  struct stat st;
  ASSERT_EQ(stat((dir.path() + "/journal.log").c_str(), &st), 0);
  EXPECT_LT(st.st_size, 3 * 4096);
  auto reopened = CreateJournaled(options, dir.path());
  ASSERT_OK(reopened);
  v1::Job after = *(*reopened)->GetJob("j", false);
  for (auto& r : *after.mutable_status()->mutable_ranks())
    r.set_sessions(1);  // as before
  after.mutable_status()->clear_leases();
  EXPECT_EQ(after.status().DebugString(), before);
  EXPECT_EQ(after.status().epoch(), 1);
  EXPECT_EQ(after.status().ranks(0).consumed(), 20);
  EXPECT_EQ(after.status().ranks(1).consumed(), 3);
  // The same cursor again with the same attempt is still a no-op, and the
  // previous epoch is still there for a new attempt.
  const v1::Cursor cursor = MakeCursor("j", 0, 2, {44, 9});
  SimTrainer again(**reopened, "j", 0, "a2", &cursor);
  EXPECT_FALSE(again.sink->finished.has_value());
  EXPECT_EQ((*reopened)->GetJob("j", false)->status().epoch(), 1);
  // Leases held at the restart come back to their holder.
  std::set<std::string> regranted;
  for (const v1::Lease& l : again.held) regranted.insert(l.lease_id());
  for (const std::string& id : regranted) EXPECT_EQ(held.count(id), 1u) << id;
  SimTrainer retry(**reopened, "j", 1, "b3", &cursor, "restart-2");
  EXPECT_FALSE(retry.sink->finished.has_value());
  EXPECT_EQ((*reopened)->GetJob("j", false)->status().epoch(), 0);
}

// A Journal over a MemoryJournal whose compactions wait in FinishCompaction
// until the test lets them go.
class HeldCompactionJournal final : public Journal {
 public:
  explicit HeldCompactionJournal(MemoryJournal* records) : records_(records) {}
  uint64_t Enqueue(const std::vector<JournalRecord>& r) override {
    return records_->Enqueue(r);
  }
  uint64_t Enqueue(const JournalRecord& r) override {
    return records_->Enqueue(r);
  }
  absl::Status WaitDurable(uint64_t t) override {
    return records_->WaitDurable(t);
  }
  uint64_t LastTicket() const override { return records_->LastTicket(); }
  bool IsDurable(uint64_t t) const override { return records_->IsDurable(t); }
  int64_t bytes_written() const override { return records_->bytes_written(); }
  void BeginCompaction() override {
    mark = records_->LastTicket();
    records_->BeginCompaction();
    begun.store(true);
  }
  absl::Status FinishCompaction(const JournalRecord& snapshot) override {
    started.Notify();
    release.WaitForNotification();
    return records_->FinishCompaction(snapshot);
  }
  std::atomic<bool> begun{false};
  absl::Notification started, release;
  uint64_t mark = 0;  // records before the compaction's snapshot

 private:
  MemoryJournal* const records_;
};

// The state the records give when replayed from the start.
std::string Replayed(const std::vector<JournalRecord>& records) {
  CoordinatorState state;
  for (const JournalRecord& r : records) EXPECT_OK(state.Apply(r));
  JournalRecord snapshot = state.Snapshot();
  return snapshot.SerializeAsString();
}

// The snapshot is written while the service goes on: trainers consume and
// jobs report while the compaction is held in FinishCompaction; the
// compacted journal (the snapshot, then exactly the records enqueued after
// its mark) replays to the same state as the whole history.
TEST(CoordinatorCompactionTest, TheServiceGoesOnWhileTheSnapshotIsWritten) {
  FakeClock clock;
  MemoryJournal records;
  auto* held = new HeldCompactionJournal(&records);
  CoordinatorOptions options;
  options.clock = &clock;
  options.wait_for_data_servers = false;
  options.journal_compact_bytes = 8192;  // in the first epoch
  RecoveredJournal journal;
  journal.journal.reset(held);
  auto created = CoordinatorService::Create(options, std::move(journal));
  ASSERT_OK(created);
  CoordinatorService& service = **created;
  v1::JobSpec spec = Spec("j", {400, 300}, 1, 2);
  spec.set_max_samples_per_lease(5);
  ASSERT_OK(service.CreateJob(spec));
  // Whatever ends the test, the held compaction ends before the service.
  absl::Cleanup release = [held] {
    if (!held->release.HasBeenNotified()) held->release.Notify();
  };
  SimTrainer t(service, "j", 0, "t");
  int64_t consumed = 0;
  while (!held->begun.load() && consumed < 700) consumed += t.Consume(1);
  ASSERT_TRUE(held->begun.load()) << consumed;
  EXPECT_GT(consumed, 0);
  held->started.WaitForNotification();
  ASSERT_EQ(t.Consume(60), 60);
  EXPECT_EQ(service.GetJob("j", false)->status().ranks(0).consumed(),
            consumed + 60);
  const std::vector<JournalRecord> history = records.records();
  ASSERT_GT(history.size(), held->mark + 12);  // 60 samples, 12 leases
  held->release.Notify();
  EXPECT_EQ(service.WaitForCompactions(), 1);
  const std::vector<JournalRecord> compacted = records.records();
  ASSERT_EQ(compacted.size(), 1 + history.size() - held->mark);
  EXPECT_TRUE(compacted[0].has_snapshot());
  for (size_t i = 1; i < compacted.size(); ++i) {
    EXPECT_EQ(compacted[i].SerializeAsString(),
              history[held->mark + i - 1].SerializeAsString())
        << i;
  }
  EXPECT_EQ(Replayed(compacted), Replayed(history));
}

// What a Once stream is sent (by the outbox's thread too).
class OnceInbox : public OnceSink {
 public:
  void Send(const v1::OnceResponse& r) override {
    absl::MutexLock lock(&mu_);
    inbox_.push_back(r);
  }
  void Finish(const absl::Status& s) override {
    absl::MutexLock lock(&mu_);
    finished_ = s;
  }
  std::vector<v1::OnceResponse> inbox() {
    absl::MutexLock lock(&mu_);
    return inbox_;
  }
  std::optional<absl::Status> finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::OnceResponse> inbox_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> finished_ ABSL_GUARDED_BY(mu_);
};

v1::OnceRequest JoinPrep(const std::string& who) {
  v1::OnceRequest r;
  r.mutable_join()->set_scope("job");
  r.mutable_join()->set_name("prep");
  r.mutable_join()->set_participant(who);
  r.mutable_join()->set_ttl_ms(10000);
  return r;
}

// A Once step's outcome is announced once its record is durable, and the
// runner's stream does not wait for that: the outbox answers.
TEST(CoordinatorDurabilityTest, AOnceOutcomeIsAnnouncedOnceDurableByTheOutbox) {
  FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  RecoveredJournal gated;
  gated.journal = std::make_unique<testing::GatedJournal>();
  auto* journal = static_cast<testing::GatedJournal*>(gated.journal.get());
  auto created = CoordinatorService::Create(options, std::move(gated));
  ASSERT_OK(created);
  std::unique_ptr<CoordinatorService> service = std::move(*created);
  OnceBarrier& once = service->once_barrier();
  auto runner = std::make_shared<OnceInbox>();
  auto waiter = std::make_shared<OnceInbox>();
  const int64_t r = once.OpenOnce(runner);
  once.OnOnceMessage(r, JoinPrep("a"));
  ASSERT_EQ(runner->inbox().size(), 1u);
  ASSERT_TRUE(runner->inbox()[0].has_run());
  const int64_t w = once.OpenOnce(waiter);
  once.OnOnceMessage(w, JoinPrep("b"));

  v1::OnceRequest succeeded;
  succeeded.mutable_succeeded()->set_run(runner->inbox()[0].run().run());
  succeeded.mutable_succeeded()->set_result("/data");
  once.OnOnceMessage(r, succeeded);  // returns with the record not durable
  EXPECT_EQ(runner->inbox().size(), 1u);
  EXPECT_FALSE(waiter->finished().has_value());

  journal->MakeDurable(journal->LastTicket());
  service->Flush();
  ASSERT_EQ(runner->inbox().size(), 2u);
  EXPECT_EQ(runner->inbox()[1].done().result(), "/data");
  ASSERT_TRUE(waiter->finished().has_value());
  EXPECT_OK(*waiter->finished());
  EXPECT_EQ(waiter->inbox().back().done().result(), "/data");
  const auto found = service->FindOnceFinished("job", "prep");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->result(), "/data");
}

}  // namespace
}  // namespace sluice
