#include "server/common/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace sluice {

absl::StatusOr<DirLock> DirLock::Acquire(const std::string& dir,
                                         const std::string& what) {
  const std::string path = dir + "/LOCK";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("cannot open the lock file ", path, " of ",
                                     what, ": ", std::strerror(err)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {0};
    const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    if (err != EWOULDBLOCK) {
      return absl::Status(
          absl::ErrnoToStatusCode(err),
          absl::StrCat("cannot lock ", path, ": ", std::strerror(err)));
    }
    int64_t pid = 0;
    const bool known =
        n > 0 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, n)),
                         &pid);
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", dir, " is in use by another process",
                     known ? absl::StrCat(" (PID ", pid, ")") : std::string(),
                     ": one process per directory (", path, " is locked)"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  // The lock holds without the PID too; only a second process's message
  // would lack it.
  const bool wrote =
      ftruncate(fd, 0) == 0 &&
      pwrite(fd, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size());
  (void)wrote;
  return DirLock(fd);
}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

DirLock::~DirLock() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace sluice
