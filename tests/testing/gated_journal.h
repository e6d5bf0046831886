// A Journal whose writes become durable (or fail) only when the test says
// so: for tests of what waits for durability (the outbox, replies that
// report state). Records are not kept. Thread-safe.
#ifndef SLUICE_TESTS_TESTING_GATED_JOURNAL_H_
#define SLUICE_TESTS_TESTING_GATED_JOURNAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator/journal.h"

namespace sluice::testing {

class GatedJournal final : public Journal {
 public:
  uint64_t Enqueue(const std::vector<JournalRecord>&) override {
    return Next();
  }
  uint64_t Enqueue(const JournalRecord&) override { return Next(); }
  absl::Status WaitDurable(uint64_t ticket) override {
    absl::MutexLock lock(&mu_);
    ++waits_;
    auto done = [&] {
      mu_.AssertHeld();
      return durable_ >= ticket || !failure_.ok();
    };
    mu_.Await(absl::Condition(&done));
    return durable_ >= ticket ? absl::OkStatus() : failure_;
  }
  uint64_t LastTicket() const override {
    absl::MutexLock lock(&mu_);
    return last_;
  }
  bool IsDurable(uint64_t ticket) const override {
    absl::MutexLock lock(&mu_);
    return durable_ >= ticket;
  }
  int64_t bytes_written() const override { return 0; }
  void BeginCompaction() override {}
  absl::Status FinishCompaction(const JournalRecord&) override {
    return absl::OkStatus();
  }

  void MakeDurable(uint64_t ticket) {
    absl::MutexLock lock(&mu_);
    durable_ = ticket;
  }
  void Fail(absl::Status status) {
    absl::MutexLock lock(&mu_);
    failure_ = std::move(status);
  }
  // Blocks until a WaitDurable call (the flusher's) is waiting.
  void AwaitWaiter() { AwaitWaits(1); }
  // Blocks until WaitDurable has been called `n` times in all.
  void AwaitWaits(int n) {
    absl::MutexLock lock(&mu_);
    auto waiting = [&] {
      mu_.AssertHeld();
      return waits_ >= n;
    };
    mu_.Await(absl::Condition(&waiting));
  }
  int waits() const {
    absl::MutexLock lock(&mu_);
    return waits_;
  }

 private:
  uint64_t Next() {
    absl::MutexLock lock(&mu_);
    return ++last_;
  }
  mutable absl::Mutex mu_;
  uint64_t last_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_ ABSL_GUARDED_BY(mu_) = 0;
  int waits_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_GATED_JOURNAL_H_
