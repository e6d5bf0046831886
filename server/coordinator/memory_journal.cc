#include "server/coordinator/memory_journal.h"

namespace sluice {

uint64_t MemoryJournal::Enqueue(const JournalRecord& record) {
  return Enqueue(std::vector<JournalRecord>{record});
}

uint64_t MemoryJournal::Enqueue(const std::vector<JournalRecord>& records) {
  absl::MutexLock lock(&mu_);
  for (const JournalRecord& r : records) {
    bytes_ += static_cast<int64_t>(r.ByteSizeLong());
    records_.push_back(r);
  }
  return records_.size();
}

uint64_t MemoryJournal::LastTicket() const {
  absl::MutexLock lock(&mu_);
  return records_.size();
}

int64_t MemoryJournal::bytes_written() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

void MemoryJournal::BeginCompaction() {
  absl::MutexLock lock(&mu_);
  compaction_mark_ = static_cast<int64_t>(records_.size());
}

absl::Status MemoryJournal::FinishCompaction(const JournalRecord& snapshot) {
  absl::MutexLock lock(&mu_);
  if (compaction_mark_ < 0) {
    return absl::FailedPreconditionError("no compaction begun");
  }
  std::vector<JournalRecord> compacted = {snapshot};
  compacted.insert(compacted.end(), records_.begin() + compaction_mark_,
                   records_.end());
  records_ = std::move(compacted);
  compaction_mark_ = -1;
  bytes_ = 0;
  for (const JournalRecord& r : records_)
    bytes_ += static_cast<int64_t>(r.ByteSizeLong());
  return absl::OkStatus();
}

std::vector<JournalRecord> MemoryJournal::records() const {
  absl::MutexLock lock(&mu_);
  return records_;
}

}  // namespace sluice
