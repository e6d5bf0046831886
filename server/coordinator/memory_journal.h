// MemoryJournal: a Journal kept in memory, for a coordinator that keeps no
// state across restarts (CoordinatorService::Create without a journal) and
// for unit tests, which read its records back.
#ifndef SLUICE_SERVER_COORDINATOR_MEMORY_JOURNAL_H_
#define SLUICE_SERVER_COORDINATOR_MEMORY_JOURNAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator/journal.h"

namespace sluice {

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

#endif  // SLUICE_SERVER_COORDINATOR_MEMORY_JOURNAL_H_
