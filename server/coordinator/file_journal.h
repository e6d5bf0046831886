// FileJournal: the coordinator's journal in a local directory, over
// GroupCommitJournal (group commit, compaction beside appends).
//
// File layout: `<dir>/journal.log`, a sequence of frames (after a
// compaction the first is a Snapshot)
//   [u32 little-endian payload length][u32 little-endian CRC-32 of payload]
//   [payload: serialized JournalRecord]
// A compaction is staged in `<dir>/journal.log.compact` (the snapshot, then
// the records appended meanwhile), fsync'd and renamed over journal.log; a
// leftover staged file is removed at open.
#ifndef SLUICE_SERVER_COORDINATOR_FILE_JOURNAL_H_
#define SLUICE_SERVER_COORDINATOR_FILE_JOURNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/common/dir_lock.h"
#include "server/coordinator/group_commit_journal.h"

namespace sluice {

class FileJournal final : public GroupCommitJournal {
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
  FileJournal(DirLock lock, int fd, std::string path, FsyncObserver on_fsync);

  static void Frame(const JournalRecord& record, std::string* out);
  absl::Status WriteBatch(const std::string& frames) override;
  absl::Status StageCompacted(const std::string& frames) override;
  absl::Status InstallCompacted(const std::string& tail) override;
  void DiscardCompacted() override;
  void OnWriteFailure(const absl::Status& status) override;

  DirLock lock_;  // held while the journal is open
  // Used only in the writer role (WriteBatch, InstallCompacted, which
  // replaces it).
  int fd_;
  const std::string path_;
  const std::string staged_path_;  // path_ + ".compact"
  const FsyncObserver on_fsync_;
  std::function<void(const absl::Status&)> on_failure_;
  int64_t replayed_ = 0;
  int64_t truncated_ = 0;
  // The staged compaction's file (StageCompacted .. Install/Discard), -1
  // when none.
  int staged_fd_ = -1;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_FILE_JOURNAL_H_
