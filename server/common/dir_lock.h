// An exclusive lock on a directory for the life of a process: flock(2) on
// `<dir>/LOCK`, which holds the owner's PID for the message a second process
// gets. The kernel drops the lock when the process dies, however it dies, so
// a stale lock never needs cleaning up. It guards one machine's processes
// against each other (two coordinators started on one journal by mistake);
// it is not a protocol between hosts on a shared filesystem.
#ifndef SLUICE_SERVER_COMMON_DIR_LOCK_H_
#define SLUICE_SERVER_COMMON_DIR_LOCK_H_

#include <string>

#include "absl/status/statusor.h"

namespace sluice {

class DirLock {
 public:
  // Takes the lock on `dir` (which must exist). FAILED_PRECONDITION naming
  // `what`, the directory and the holder's PID when another process holds
  // it; the errno's code when the lock file cannot be opened.
  static absl::StatusOr<DirLock> Acquire(const std::string& dir,
                                         const std::string& what);

  DirLock(DirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_DIR_LOCK_H_
