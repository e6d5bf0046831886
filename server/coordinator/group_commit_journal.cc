#include "server/coordinator/group_commit_journal.h"

#include <utility>

namespace sluice {

uint64_t GroupCommitJournal::Enqueue(
    const std::vector<JournalRecord>& records) {
  std::string framed;
  for (const JournalRecord& record : records) frame_(record, &framed);
  return EnqueueFramed(std::move(framed));
}

uint64_t GroupCommitJournal::Enqueue(const JournalRecord& record) {
  std::string framed;
  frame_(record, &framed);
  return EnqueueFramed(std::move(framed));
}

uint64_t GroupCommitJournal::EnqueueFramed(std::string framed) {
  absl::MutexLock lock(&mu_);
  if (capturing_) captured_ += framed;
  if (pending_.empty()) {
    pending_.swap(framed);
  } else {
    pending_ += framed;
  }
  return ++queued_seq_;
}

absl::Status GroupCommitJournal::WaitDurable(uint64_t my_seq) {
  absl::MutexLock lock(&mu_);
  while (synced_seq_ < my_seq && write_status_.ok()) {
    if (writing_) {
      auto writer_done = [this, my_seq] {
        mu_.AssertHeld();
        return !writing_ || synced_seq_ >= my_seq || !write_status_.ok();
      };
      mu_.Await(absl::Condition(&writer_done));
      continue;
    }
    writing_ = true;
    std::string batch;
    batch.swap(pending_);
    const uint64_t batch_seq = queued_seq_;
    mu_.Unlock();
    absl::Status status;
    if (!batch.empty()) status = WriteBatch(batch);
    mu_.Lock();
    writing_ = false;
    if (!status.ok()) {
      // After a failed write the storage's tail is unknown: refuse further
      // appends rather than acknowledge state that may not be durable.
      if (write_status_.ok()) {
        write_status_ = status;
        OnWriteFailure(status);
      }
    } else {
      bytes_written_ += static_cast<int64_t>(batch.size());
      synced_seq_ = batch_seq;
    }
  }
  return write_status_;
}

void GroupCommitJournal::BeginCompaction() {
  absl::MutexLock lock(&mu_);
  capturing_ = true;
  captured_.clear();
}

absl::Status GroupCommitJournal::FinishCompaction(
    const JournalRecord& snapshot) {
  std::string framed;
  frame_(snapshot, &framed);
  absl::Status status = StageCompacted(framed);
  std::string tail, unwritten;
  uint64_t tail_seq = 0;
  bool writer = false;
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](GroupCommitJournal* j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j->mu_) {
          return !j->writing_ || !j->write_status_.ok();
        },
        this));
    status = write_status_;
    if (status.ok()) {
      // The new journal holds every record enqueued so far: the snapshot
      // and the tail. Those not yet written to the old one need not be.
      writing_ = true;
      writer = true;
      capturing_ = false;
      tail.swap(captured_);
      unwritten.swap(pending_);
      tail_seq = queued_seq_;
    }
  }
  if (status.ok()) status = InstallCompacted(tail);
  if (!status.ok()) DiscardCompacted();
  absl::MutexLock lock(&mu_);
  capturing_ = false;
  captured_.clear();
  if (!writer) return status;
  writing_ = false;
  if (!status.ok()) {
    // The old journal stays in force: what it lacks is written to it next.
    unwritten += pending_;
    pending_.swap(unwritten);
    return status;
  }
  synced_seq_ = tail_seq;
  bytes_written_ = static_cast<int64_t>(framed.size() + tail.size());
  return absl::OkStatus();
}

uint64_t GroupCommitJournal::LastTicket() const {
  absl::MutexLock lock(&mu_);
  return queued_seq_;
}

bool GroupCommitJournal::IsDurable(uint64_t ticket) const {
  absl::MutexLock lock(&mu_);
  return synced_seq_ >= ticket;
}

int64_t GroupCommitJournal::bytes_written() const {
  absl::MutexLock lock(&mu_);
  return bytes_written_;
}

void GroupCommitJournal::Fail(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (write_status_.ok()) write_status_ = status;
}

void GroupCommitJournal::set_bytes_written(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes_written_ = bytes;
}

}  // namespace sluice
