// GroupCommitJournal: what every durable Journal shares, over storage a
// subclass supplies (FileJournal: a local file; EtcdJournal: keys in etcd).
//
// Enqueue frames records into a pending buffer and returns a ticket.
// WaitDurable is group commit: the first waiter that finds no write in
// progress takes the writer role and hands everything pending to
// WriteBatch (one write and one fsync, or one etcd transaction, for all of
// it); the other waiters wait for it. The storage is only ever written by
// the thread holding the writer role, and no lock is held while it writes,
// so Enqueue never waits for storage.
//
// Compaction runs beside appends. BeginCompaction marks the point the
// snapshot describes and from then on keeps a copy of every record enqueued
// after it. FinishCompaction stages the framed snapshot (StageCompacted:
// the big write, beside WriteBatch calls), then takes the writer role and
// hands InstallCompacted the records kept since the mark, which it appends
// to the staged journal before putting it in place of the old one. A
// crash at any point leaves either the old journal or the new one, each
// holding every acknowledged record.
#ifndef SLUICE_SERVER_COORDINATOR_GROUP_COMMIT_JOURNAL_H_
#define SLUICE_SERVER_COORDINATOR_GROUP_COMMIT_JOURNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator/journal.h"

namespace sluice {

// The little-endian u32 fields of the storages' frame headers.
inline void PutU32LE(std::string* out, uint32_t v) {
  const char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8),
                     static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
  out->append(b, 4);
}
inline uint32_t GetU32LE(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return u[0] | (u[1] << 8) | (u[2] << 16) |
         (static_cast<uint32_t>(u[3]) << 24);
}

class GroupCommitJournal : public Journal {
 public:
  uint64_t Enqueue(const std::vector<JournalRecord>& records) final;
  uint64_t Enqueue(const JournalRecord& record) final;
  absl::Status WaitDurable(uint64_t ticket) final;
  uint64_t LastTicket() const final;
  bool IsDurable(uint64_t ticket) const final;
  int64_t bytes_written() const final;
  void BeginCompaction() final;
  absl::Status FinishCompaction(const JournalRecord& snapshot) final;

 protected:
  // Appends `record` to `out` in the storage's frame format.
  using FrameFunction = void (*)(const JournalRecord& record, std::string* out);
  explicit GroupCommitJournal(FrameFunction frame) : frame_(frame) {}

  // The storage. WriteBatch and InstallCompacted run only in the writer
  // role (one at a time, never together); StageCompacted and
  // DiscardCompacted may run beside a WriteBatch.
  //
  // Appends `frames` (whole frames) durably.
  virtual absl::Status WriteBatch(const std::string& frames) = 0;
  // Writes `frames` (the framed snapshot) durably as the start of a new
  // journal, not yet in force.
  virtual absl::Status StageCompacted(const std::string& frames) = 0;
  // Appends `tail` (every record enqueued since BeginCompaction, framed) to
  // the staged journal and puts it in place of the journal, atomically.
  virtual absl::Status InstallCompacted(const std::string& tail) = 0;
  // Removes what StageCompacted wrote (compaction failed; the journal in
  // force is unchanged).
  virtual void DiscardCompacted() = 0;
  // The first failed WriteBatch, called with the journal's lock held (it
  // must not call the journal). Every WaitDurable fails from then on.
  virtual void OnWriteFailure(const absl::Status& status) { (void)status; }

  // Fails every later WaitDurable with `status` (unless one failed first).
  void Fail(const absl::Status& status);
  // The size of the journal found at open.
  void set_bytes_written(int64_t bytes);

 private:
  uint64_t EnqueueFramed(std::string framed);

  const FrameFunction frame_;
  mutable absl::Mutex mu_;
  std::string pending_ ABSL_GUARDED_BY(mu_);  // framed, not yet written
  uint64_t queued_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t synced_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // the writer role is taken
  absl::Status write_status_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_written_ ABSL_GUARDED_BY(mu_) = 0;
  // Between BeginCompaction and FinishCompaction: every record enqueued
  // since, framed.
  bool capturing_ ABSL_GUARDED_BY(mu_) = false;
  std::string captured_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_GROUP_COMMIT_JOURNAL_H_
