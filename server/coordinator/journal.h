// Journal: the coordinator's journal interface, an append-only log of
// JournalRecords (see journal.proto). Durable state changes only through
// it: validate, Apply, Enqueue, then answer once WaitDurable says the
// records are written and fsync'd. Replay at start-up hands every record
// back in order (open_journal.h). Implementations: FileJournal and
// EtcdJournal (over GroupCommitJournal), MemoryJournal.
//
// Thread-safe: Enqueue and WaitDurable may be called from many threads at
// once; a durable journal group-commits concurrent appends.
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

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_JOURNAL_H_
