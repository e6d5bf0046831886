// The coordinator driven from many threads at once, as its gRPC threads
// drive it: trainer sessions granting and completing leases through the
// journaled outbox while the expiry thread runs, Barrier generations and a
// Once step joined by every thread. Exact counts decide; the ThreadSanitizer
// build (make test-tsan) runs these to check the locking itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "server/common/work_unit.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/open_journal.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::FakeClock;

// A bound on how long one thread waits for the next message: a hang fails
// the test instead of stalling the suite. It decides nothing else.
constexpr absl::Duration kStuck = absl::Seconds(120);

// A sink the service may call from any thread (the outbox's flusher, the
// expiry thread, the caller); the owning test thread blocks in Take().
template <typename Sink, typename Message>
class BlockingSink : public Sink {
 public:
  // Everything received since the last call, waiting for at least one
  // message or the end of the stream. False when nothing came in kStuck.
  bool Take(std::vector<Message>* out, std::optional<absl::Status>* finished) {
    if (!mu_.LockWhenWithTimeout(absl::Condition(this, &BlockingSink::Ready),
                                 kStuck)) {
      mu_.Unlock();
      return false;
    }
    out->swap(inbox_);
    inbox_.clear();
    *finished = finished_;
    mu_.Unlock();
    return true;
  }

 protected:
  void Push(Message m) {
    absl::MutexLock lock(&mu_);
    inbox_.push_back(std::move(m));
  }
  void End(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    finished_ = s;
  }

 private:
  bool Ready() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !inbox_.empty() || finished_.has_value();
  }
  mutable absl::Mutex mu_;
  std::vector<Message> inbox_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> finished_ ABSL_GUARDED_BY(mu_);
};

class TrainerSink : public BlockingSink<SessionSink, v1::CoordinatorMessage> {
 public:
  void Send(v1::CoordinatorMessage m) override { Push(std::move(m)); }
  void Finish(const absl::Status& s) override { End(s); }
};

class StepSink : public BlockingSink<OnceSink, v1::OnceResponse> {
 public:
  void Send(const v1::OnceResponse& r) override { Push(r); }
  void Finish(const absl::Status& s) override { End(s); }
};

v1::JobSpec Spec(int32_t world_size, int64_t epochs) {
  v1::JobSpec spec;
  spec.set_name("j");
  for (int i = 0; i < 12; ++i) {
    auto* s = spec.mutable_manifest()->add_shards();
    s->set_url("/data/shard-" + std::to_string(i) + ".tar");
    s->set_num_samples(10 + i);  // 186 samples
  }
  spec.set_world_size(world_size);
  spec.set_num_epochs(epochs);
  spec.set_shuffle(true);
  spec.set_shuffle_window(1);
  spec.set_seed(11);
  spec.set_lease_ttl_ms(60000);
  return spec;
}

// What one trainer thread saw of the job.
struct Trainer {
  std::map<std::pair<int64_t, std::pair<int, int64_t>>, int> samples;
  std::map<int64_t, int64_t> per_epoch;
  int job_done = 0;
  absl::Status finished = absl::UnknownError("never finished");
  bool stuck = false;
};

void RunTrainer(CoordinatorService* service, int rank, Trainer* out, int worker,
                int num_workers) {
  auto sink = std::make_shared<TrainerSink>();
  const int64_t id = service->OpenSession(sink);
  v1::TrainerMessage hello;
  hello.mutable_hello()->set_job("j");
  hello.mutable_hello()->set_rank(rank);
  hello.mutable_hello()->set_worker(worker);
  hello.mutable_hello()->set_num_workers(num_workers);
  hello.mutable_hello()->set_trainer_id("t" + std::to_string(rank) + "-" +
                                        std::to_string(worker));
  service->OnMessage(id, hello);
  v1::TrainerMessage want;
  want.mutable_want()->set_credits(3);
  service->OnMessage(id, want);
  for (;;) {
    std::vector<v1::CoordinatorMessage> inbox;
    std::optional<absl::Status> finished;
    if (!sink->Take(&inbox, &finished)) {
      out->stuck = true;
      break;
    }
    for (const v1::CoordinatorMessage& m : inbox) {
      if (m.has_job_done()) ++out->job_done;
      if (!m.has_grant()) continue;
      const v1::Lease& lease = m.grant().lease();
      const v1::WorkUnit& unit = lease.unit();
      for (int64_t k = unit.begin(); k < unit.end(); ++k) {
        ++out->samples[{lease.epoch(), {UnitIndex(unit), k}}];
      }
      out->per_epoch[lease.epoch()] += unit.end() - unit.begin();
      // Half the leases report progress first, as a reading trainer does.
      if ((unit.begin() + rank) % 2 == 0) {
        v1::TrainerMessage progress;
        progress.mutable_progress()->mutable_lease()->set_lease_id(
            lease.lease_id());
        progress.mutable_progress()->mutable_lease()->set_fence(lease.fence());
        progress.mutable_progress()->set_consumed(unit.end() - unit.begin());
        service->OnMessage(id, progress);
      }
      v1::TrainerMessage complete;
      complete.mutable_complete()->mutable_lease()->set_lease_id(
          lease.lease_id());
      complete.mutable_complete()->mutable_lease()->set_fence(lease.fence());
      service->OnMessage(id, complete);
    }
    if (finished.has_value()) {
      out->finished = *finished;
      break;
    }
  }
  service->CloseSession(id);
}

class CoordinatorConcurrencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.clock = &clock_;
    options.wait_for_data_servers = false;  // these trainers read nothing
    // A file journal: group commits, the outbox's flusher thread.
    auto journal = OpenFileJournal(dir_.path());
    ASSERT_OK(journal);
    auto service = CoordinatorService::Create(options, *std::move(journal));
    ASSERT_OK(service);
    service_ = std::move(*service);
    service_->StartExpiryThread();
  }
  void TearDown() override { service_->Drain(); }

  FakeClock clock_;
  testing::TempDir dir_;
  std::unique_ptr<CoordinatorService> service_;
};

// Four rank threads read three epochs while a fifth thread reads the job's
// status and nudges the clock (well inside the lease TTL, so the expiry
// thread wakes but nothing expires): every sample is granted exactly once
// per epoch and the ranks get equal shares.
TEST_F(CoordinatorConcurrencyTest, RankThreadsCoverEverySampleOncePerEpoch) {
  constexpr int kRanks = 4;
  ASSERT_OK(service_->CreateJob(Spec(kRanks, 3)));
  std::vector<Trainer> trainers(kRanks);
  std::atomic<bool> done{false};
  std::thread observer([&] {
    for (int i = 0; !done; ++i) {
      auto job = service_->GetJob("j", false);
      EXPECT_TRUE(job.ok()) << job.status();
      if (i < 10000) clock_.Advance(absl::Microseconds(100));  // 1 s at most
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back(RunTrainer, service_.get(), r, &trainers[r], 0, 0);
  }
  for (std::thread& t : threads) t.join();
  done = true;
  observer.join();

  std::map<std::pair<int64_t, std::pair<int, int64_t>>, int> all;
  for (int r = 0; r < kRanks; ++r) {
    const Trainer& t = trainers[r];
    ASSERT_FALSE(t.stuck) << "rank " << r << " heard nothing for " << kStuck;
    EXPECT_OK(t.finished) << "rank " << r;
    EXPECT_EQ(t.job_done, 1) << "rank " << r;
    // 186 samples, 4 ranks: 46 each per epoch, 2 dropped for equal steps.
    EXPECT_EQ(t.per_epoch,
              (std::map<int64_t, int64_t>{{0, 46}, {1, 46}, {2, 46}}))
        << "rank " << r;
    for (const auto& [sample, n] : t.samples) all[sample] += n;
  }
  EXPECT_EQ(all.size(), 3u * 184u);
  for (const auto& [sample, n] : all) {
    EXPECT_EQ(n, 1) << "epoch " << sample.first << " shard "
                    << sample.second.first << " sample "
                    << sample.second.second;
  }
  auto job = service_->GetJob("j", false);
  ASSERT_OK(job);
  EXPECT_EQ(job->status().state(), v1::JOB_STATE_DONE);
  EXPECT_EQ(job->status().leases().expired(), 0);
}

// Two ranks of two DataLoader workers each, one thread per reader, say
// Hello at once: the first plans the epoch for two readers per rank
// outside the lock while the others wait for it, and the three epochs are
// each read exactly once, every reader getting its slot's share.
TEST_F(CoordinatorConcurrencyTest, WorkerThreadsCoverEverySampleOncePerEpoch) {
  constexpr int kRanks = 2;
  constexpr int kWorkers = 2;
  ASSERT_OK(service_->CreateJob(Spec(kRanks, 3)));
  std::vector<Trainer> readers(kRanks * kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    for (int w = 0; w < kWorkers; ++w) {
      threads.emplace_back(RunTrainer, service_.get(), r,
                           &readers[r * kWorkers + w], w, kWorkers);
    }
  }
  for (std::thread& t : threads) t.join();
  std::map<std::pair<int64_t, std::pair<int, int64_t>>, int> all;
  for (size_t i = 0; i < readers.size(); ++i) {
    const Trainer& t = readers[i];
    ASSERT_FALSE(t.stuck) << "reader " << i << " heard nothing for " << kStuck;
    EXPECT_OK(t.finished) << "reader " << i;
    // 186 samples, 2 ranks: 93 each per epoch, split 47 + 46.
    const int64_t share = i % kWorkers == 0 ? 47 : 46;
    EXPECT_EQ(t.per_epoch,
              (std::map<int64_t, int64_t>{{0, share}, {1, share}, {2, share}}))
        << "reader " << i;
    for (const auto& [sample, n] : t.samples) all[sample] += n;
  }
  EXPECT_EQ(all.size(), 3u * 186u);
  for (const auto& [sample, n] : all) EXPECT_EQ(n, 1);
  // Epoch 0 for two readers, epochs 1 and 2, and the finished job's 3: all
  // planned ahead unless an advance came before its plan was ready.
  const auto [taken, computed] = service_->PlansTakenAndComputed();
  EXPECT_EQ(taken + computed, 5);
  EXPECT_GE(taken, 1);  // the Hellos' plan always is
}

// Four threads meet at ten Barrier generations of one name; each
// generation completes once, with all four, before any thread moves on.
TEST_F(CoordinatorConcurrencyTest, BarrierThreadsMeetAtEveryGeneration) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 10;
  std::vector<std::vector<int64_t>> generations(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < kRounds; ++round) {
        v1::BarrierRequest request;
        request.set_scope("job");
        request.set_name("step");
        request.set_participant("p" + std::to_string(i));
        request.set_participants(kThreads);
        request.set_timeout_ms(600000);
        absl::Notification done;
        absl::StatusOr<v1::BarrierResponse> response;
        service_->once_barrier().Barrier(
            request, [&](absl::StatusOr<v1::BarrierResponse> r) {
              response = std::move(r);
              done.Notify();
            });
        if (!done.WaitForNotificationWithTimeout(kStuck)) {
          ADD_FAILURE() << "p" << i << " stuck in round " << round;
          return;
        }
        ASSERT_OK(response);
        EXPECT_EQ(response->arrived_size(), kThreads);
        generations[i].push_back(response->generation());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 1; i < kThreads; ++i) {
    EXPECT_EQ(generations[i], generations[0]) << "p" << i;
  }
  ASSERT_EQ(generations[0].size(), size_t{kRounds});
  for (int round = 1; round < kRounds; ++round) {
    EXPECT_EQ(generations[0][round], generations[0][round - 1] + 1);
  }
}

// Four threads join one Once step at the same time: exactly one runs it,
// and every thread ends knowing the runner's result.
TEST_F(CoordinatorConcurrencyTest, OnceThreadsRunTheStepExactlyOnce) {
  constexpr int kThreads = 4;
  std::atomic<int> runs{0};
  std::vector<std::string> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto sink = std::make_shared<StepSink>();
      OnceBarrier& once = service_->once_barrier();
      const int64_t id = once.OpenOnce(sink);
      v1::OnceRequest join;
      join.mutable_join()->set_scope("job");
      join.mutable_join()->set_name("prep");
      join.mutable_join()->set_participant("p" + std::to_string(i));
      join.mutable_join()->set_ttl_ms(600000);
      once.OnOnceMessage(id, join);
      for (;;) {
        std::vector<v1::OnceResponse> inbox;
        std::optional<absl::Status> finished;
        if (!sink->Take(&inbox, &finished)) {
          ADD_FAILURE() << "p" << i << " heard nothing for " << kStuck;
          break;
        }
        for (const v1::OnceResponse& r : inbox) {
          if (r.has_run()) {
            ++runs;
            v1::OnceRequest succeeded;
            succeeded.mutable_succeeded()->set_run(r.run().run());
            results[i] = "by p" + std::to_string(i);
            succeeded.mutable_succeeded()->set_result(results[i]);
            once.OnOnceMessage(id, succeeded);
          }
          if (r.has_done()) results[i] = r.done().result();
        }
        if (finished.has_value()) {
          EXPECT_OK(*finished) << "p" << i;
          break;
        }
      }
      once.CloseOnce(id);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(runs.load(), 1);
  ASSERT_FALSE(results[0].empty());
  EXPECT_THAT(results, ::testing::Each(results[0]));
}

}  // namespace
}  // namespace sluice
