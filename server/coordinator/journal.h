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
#include "server/common/dir_lock.h"
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
  // Replaces the whole journal with `snapshot` (a Snapshot record holding
  // the state after every record enqueued so far, which it supersedes):
  // written to a temp file, fsync'd, renamed over the journal. The caller
  // must not Enqueue concurrently. On error the journal is unchanged.
  virtual absl::Status Compact(const JournalRecord& snapshot) = 0;
};

// Observes each fsync's duration in seconds (for a metrics histogram).
using FsyncObserver = std::function<void(double seconds)>;

// File layout: `<dir>/journal.log`, a sequence of frames (after a
// compaction the first is a Snapshot)
//   [u32 little-endian payload length][u32 little-endian CRC-32 of payload]
//   [payload: serialized JournalRecord]
class FileJournal final : public Journal {
 public:
  // Replays `<dir>/journal.log` into `apply`, then opens it for appending.
  // A torn tail (incomplete or bad last frame) is truncated away with a log
  // line; a bad frame followed by more data is DATA_LOSS naming its offset.
  // NOT_FOUND if `dir` does not exist and `create` is false;
  // FAILED_PRECONDITION naming the holder's PID if another process has it
  // open (the directory is locked for the journal's life, DirLock).
  static absl::StatusOr<std::unique_ptr<FileJournal>> Open(
      const std::string& dir, bool create,
      const std::function<absl::Status(const JournalRecord&)>& apply,
      FsyncObserver on_fsync = nullptr);

  ~FileJournal() override;

  uint64_t Enqueue(const std::vector<JournalRecord>& records) override;
  uint64_t Enqueue(const JournalRecord& record) override;
  absl::Status WaitDurable(uint64_t ticket) override;
  uint64_t LastTicket() const override;
  bool IsDurable(uint64_t ticket) const override;
  int64_t bytes_written() const override;
  absl::Status Compact(const JournalRecord& snapshot) override;

  // Called once, by the thread whose write or fsync failed first (with the
  // journal's lock held: it must not call the journal). From then on every
  // WaitDurable fails with that status.
  void set_on_failure(std::function<void(const absl::Status&)> on_failure) {
    on_failure_ = std::move(on_failure);
  }

  // Records replayed at Open.
  int64_t replayed_records() const { return replayed_; }
  // Bytes cut off a torn tail at Open (0 when the file was whole).
  int64_t truncated_bytes() const { return truncated_; }

 private:
  FileJournal(DirLock lock, int fd, std::string path, FsyncObserver on_fsync)
      : lock_(std::move(lock)),
        fd_(fd),
        path_(std::move(path)),
        on_fsync_(std::move(on_fsync)) {}

  static void Frame(const JournalRecord& record, std::string* out);
  uint64_t EnqueueFramed(std::string framed);

  DirLock lock_;  // held while the journal is open
  int fd_;        // replaced only by Compact, while no write is in progress
  const std::string path_;
  const FsyncObserver on_fsync_;
  std::function<void(const absl::Status&)> on_failure_;
  int64_t replayed_ = 0;
  int64_t truncated_ = 0;

  mutable absl::Mutex mu_;
  std::string pending_ ABSL_GUARDED_BY(mu_);  // framed, not yet written
  uint64_t queued_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t synced_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status write_status_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_written_ ABSL_GUARDED_BY(mu_) = 0;
};

// In-memory Journal for unit tests of the coordinator logic.
class MemoryJournal final : public Journal {
 public:
  uint64_t Enqueue(const std::vector<JournalRecord>& records) override;
  uint64_t Enqueue(const JournalRecord& record) override;
  absl::Status WaitDurable(uint64_t) override { return absl::OkStatus(); }
  uint64_t LastTicket() const override;
  bool IsDurable(uint64_t) const override { return true; }
  int64_t bytes_written() const override;
  absl::Status Compact(const JournalRecord& snapshot) override;
  std::vector<JournalRecord> records() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<JournalRecord> records_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_JOURNAL_H_
