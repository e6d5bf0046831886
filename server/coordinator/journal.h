// The coordinator's journal: an append-only log of JournalRecords.
//
// Durable state changes only through it (see journal.proto): validate, Append
// (returns once the records are fsync'd), then Apply. Replay hands every
// record back in order at start-up.
//
// Thread-safe: Append may be called from many threads at once; concurrent
// appends are group-committed (one write + one fsync for all of them).
#ifndef SLUICE_SERVER_COORDINATOR_JOURNAL_H_
#define SLUICE_SERVER_COORDINATOR_JOURNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "sluice/v1/journal.pb.h"

namespace sluice {

using JournalRecord = ::sluice::v1::internal::JournalRecord;

class Journal {
 public:
  virtual ~Journal() = default;
  // Queues `records` without blocking; their place in the journal is fixed
  // by the order of Enqueue calls (callers enqueue under their state lock, so
  // journal order is apply order). Returns a ticket for WaitDurable.
  virtual uint64_t Enqueue(const std::vector<JournalRecord>& records) = 0;
  // One record (without copying it into a vector: a new job's record can
  // hold a million-shard manifest).
  virtual uint64_t Enqueue(const JournalRecord& record) = 0;
  // Blocks until everything up to `ticket` is durable (written + fsync'd),
  // sharing one fsync among all waiters (group commit).
  virtual absl::Status WaitDurable(uint64_t ticket) = 0;
  // The ticket of the last Enqueue (0 if none).
  virtual uint64_t LastTicket() const = 0;
  // Whether everything up to `ticket` is durable (never blocks).
  virtual bool IsDurable(uint64_t ticket) const = 0;
  // Enqueue + WaitDurable.
  absl::Status Append(const std::vector<JournalRecord>& records) {
    return WaitDurable(Enqueue(records));
  }
  // Size of the journal in bytes (for metrics and compaction).
  virtual int64_t bytes_written() const = 0;
  // Compaction replaces the journal with one Snapshot record and the records
  // after it. BeginCompaction marks the point the snapshot describes: call
  // it where Enqueue calls are ordered with the state (under the caller's
  // state lock), together with taking the snapshot of the state after
  // every record enqueued so far. FinishCompaction(snapshot) may then run
  // on any thread, without that lock, while records are enqueued and made
  // durable: it writes the snapshot, then every record enqueued since the
  // mark, in place of the journal. On error the journal is unchanged. One
  // compaction at a time.
  virtual void BeginCompaction() = 0;
  virtual absl::Status FinishCompaction(const JournalRecord& snapshot) = 0;
  // Both at once, for a caller that enqueues nothing meanwhile.
  absl::Status Compact(const JournalRecord& snapshot) {
    BeginCompaction();
    return FinishCompaction(snapshot);
  }
};

// Observes each fsync's duration in seconds (for a metrics histogram).
using FsyncObserver = std::function<void(double seconds)>;

// In-memory Journal for unit tests of the coordinator logic.
class MemoryJournal final : public Journal {
 public:
  uint64_t Enqueue(const std::vector<JournalRecord>& records) override;
  uint64_t Enqueue(const JournalRecord& record) override;
  absl::Status WaitDurable(uint64_t) override { return absl::OkStatus(); }
  uint64_t LastTicket() const override;
  bool IsDurable(uint64_t) const override { return true; }
  int64_t bytes_written() const override;
  void BeginCompaction() override;
  absl::Status FinishCompaction(const JournalRecord& snapshot) override;
  std::vector<JournalRecord> records() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<JournalRecord> records_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The records before this index are the ones a compaction's snapshot
  // replaces (-1: none begun).
  int64_t compaction_mark_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_JOURNAL_H_
