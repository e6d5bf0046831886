#include "server/coordinator/file_journal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/logging.h"
#include "server/common/status_macros.h"

namespace sluice {
namespace {

constexpr size_t kHeaderBytes = 8;
// A frame claiming more than this is corruption, not a record.
constexpr uint32_t kMaxRecordBytes = 512u << 20;

uint32_t Crc(const char* data, size_t n) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n)));
}

// The offset of the first whole, valid record at or after `from` (non-empty
// payload within the file, CRC matching, parsing as a JournalRecord), if any.
// Zeros (a preallocated or zero-filled tail) never count as one.
std::optional<size_t> FindValidFrame(const std::string& data, size_t from) {
  for (size_t p = from; p + kHeaderBytes < data.size(); ++p) {
    const uint32_t length = GetU32LE(data.data() + p);
    if (length == 0 || length > kMaxRecordBytes ||
        length > data.size() - p - kHeaderBytes) {
      continue;
    }
    if (Crc(data.data() + p + kHeaderBytes, length) !=
        GetU32LE(data.data() + p + 4))
      continue;
    v1::internal::JournalRecord record;
    if (record.ParseFromArray(data.data() + p + kHeaderBytes,
                              static_cast<int>(length)))
      return p;
  }
  return std::nullopt;
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  const int e = errno;
  const std::string message = absl::StrCat(what, " ", path, ": ", strerror(e));
  return e == ENOENT ? absl::NotFoundError(message)
                     : absl::InternalError(message);
}

absl::StatusOr<std::string> ReadAll(int fd, const std::string& path) {
  std::string data;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot read journal", path);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  return data;
}

// Writes all of `bytes` to `fd` (INTERNAL naming `what` and `path`).
absl::Status WriteAll(int fd, const std::string& bytes, absl::string_view what,
                      const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(what, path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileJournal>> FileJournal::Open(
    const std::string& dir, bool create,
    const std::function<absl::Status(const JournalRecord&)>& apply,
    FsyncObserver on_fsync) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    if (!create) return Errno("journal directory", dir);
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("cannot create journal directory", dir);
    }
  } else if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("journal path ", dir, " is not a directory"));
  }
  absl::StatusOr<DirLock> lock = DirLock::Acquire(dir, "journal directory");
  if (!lock.ok()) return lock.status();
  const std::string path = dir + "/journal.log";
  unlink((path + ".compact").c_str());  // an interrupted compaction
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot open journal", path);
  std::unique_ptr<FileJournal> journal(
      new FileJournal(*std::move(lock), fd, path, std::move(on_fsync)));

  absl::StatusOr<std::string> data = ReadAll(fd, path);
  if (!data.ok()) return data.status();
  size_t offset = 0;
  while (offset < data->size()) {
    const size_t left = data->size() - offset;
    bool bad = false;
    uint32_t length = 0;
    if (left < kHeaderBytes) {
      bad = true;
    } else {
      length = GetU32LE(data->data() + offset);
      const uint32_t crc = GetU32LE(data->data() + offset + 4);
      // No record is empty: a zero length is a zero-filled tail or damage.
      if (length == 0 || length > kMaxRecordBytes ||
          left - kHeaderBytes < length) {
        bad = true;
      } else if (Crc(data->data() + offset + kHeaderBytes, length) != crc) {
        bad = true;
      }
    }
    if (bad) {
      // A bad frame is a torn tail only if it is the last thing in the file:
      // a write cut short (its length reaches the end) or a zero-filled
      // tail, with no whole record after it. A damaged length field in the
      // middle also "reaches the end", but valid records come after it.
      const bool last = left < kHeaderBytes || length > kMaxRecordBytes ||
                        left - kHeaderBytes <= length;
      const bool zeros =
          data->find_first_not_of('\0', offset) == std::string::npos;
      if (const std::optional<size_t> next =
              FindValidFrame(*data, offset + 1)) {
        return absl::DataLossError(absl::StrCat(
            "journal ", path, " is corrupt at offset ", offset,
            ": the record there (", length,
            " bytes claimed) is damaged and a whole record follows at offset ",
            *next, "; refusing to start"));
      }
      if (!last && !zeros) {
        return absl::DataLossError(
            absl::StrCat("journal ", path, " is corrupt at offset ", offset,
                         " (bad record followed by ", left,
                         " more bytes); refusing to start"));
      }
      journal->truncated_ = static_cast<int64_t>(left);
      LogWarning("journal %s: torn tail of %d bytes at offset %d truncated",
                 path, left, offset);
      if (ftruncate(fd, static_cast<off_t>(offset)) != 0 || fsync(fd) != 0) {
        return Errno("cannot truncate torn journal tail", path);
      }
      break;
    }
    JournalRecord record;
    if (!record.ParseFromArray(data->data() + offset + kHeaderBytes,
                               static_cast<int>(length))) {
      return absl::DataLossError(
          absl::StrCat("journal ", path, ": record at offset ", offset,
                       " has a valid CRC but does not parse"));
    }
    if (absl::Status s = apply(record); !s.ok()) {
      return absl::DataLossError(absl::StrCat("journal ", path,
                                              ": replaying record at offset ",
                                              offset, ": ", s.message()));
    }
    ++journal->replayed_;
    offset += kHeaderBytes + length;
  }
  if (lseek(fd, static_cast<off_t>(offset), SEEK_SET) < 0) {
    return Errno("cannot seek journal", path);
  }
  journal->set_bytes_written(static_cast<int64_t>(offset));
  return journal;
}

FileJournal::FileJournal(DirLock lock, int fd, std::string path,
                         FsyncObserver on_fsync)
    : GroupCommitJournal(&FileJournal::Frame),
      lock_(std::move(lock)),
      fd_(fd),
      path_(std::move(path)),
      staged_path_(path_ + ".compact"),
      on_fsync_(std::move(on_fsync)) {}

FileJournal::~FileJournal() {
  close(fd_);
  if (staged_fd_ >= 0) DiscardCompacted();
}

void FileJournal::Frame(const JournalRecord& record, std::string* out) {
  // Serialized in place after its header (a new job's record can hold a
  // million-shard manifest: no extra copies).
  const size_t header = out->size();
  out->append(kHeaderBytes, '\0');
  record.AppendToString(out);
  const size_t length = out->size() - header - kHeaderBytes;
  std::string fields;
  PutU32LE(&fields, static_cast<uint32_t>(length));
  PutU32LE(&fields, Crc(out->data() + header + kHeaderBytes, length));
  out->replace(header, kHeaderBytes, fields);
}

absl::Status FileJournal::WriteBatch(const std::string& frames) {
  RETURN_IF_ERROR(WriteAll(fd_, frames, "cannot write journal", path_));
  const absl::Time start = absl::Now();
  absl::Status status;
  if (fdatasync(fd_) != 0) status = Errno("cannot fsync journal", path_);
  if (on_fsync_) on_fsync_(absl::ToDoubleSeconds(absl::Now() - start));
  return status;
}

void FileJournal::OnWriteFailure(const absl::Status& status) {
  if (on_failure_) on_failure_(status);
}

absl::Status FileJournal::StageCompacted(const std::string& frames) {
  staged_fd_ =
      open(staged_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (staged_fd_ < 0) {
    return Errno("cannot create compacted journal", staged_path_);
  }
  RETURN_IF_ERROR(WriteAll(staged_fd_, frames, "cannot write compacted journal",
                           staged_path_));
  if (fsync(staged_fd_) != 0) {
    return Errno("cannot fsync compacted journal", staged_path_);
  }
  return absl::OkStatus();
}

absl::Status FileJournal::InstallCompacted(const std::string& tail) {
  RETURN_IF_ERROR(WriteAll(staged_fd_, tail, "cannot write compacted journal",
                           staged_path_));
  if (!tail.empty() && fdatasync(staged_fd_) != 0) {
    return Errno("cannot fsync compacted journal", staged_path_);
  }
  if (rename(staged_path_.c_str(), path_.c_str()) != 0) {
    return Errno("cannot rename compacted journal over", path_);
  }
  // The rename is durable once the directory is.
  const std::string dir = path_.substr(0, path_.rfind('/'));
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  close(fd_);
  fd_ = staged_fd_;
  staged_fd_ = -1;
  return absl::OkStatus();
}

void FileJournal::DiscardCompacted() {
  if (staged_fd_ >= 0) close(staged_fd_);
  staged_fd_ = -1;
  unlink(staged_path_.c_str());
}

}  // namespace sluice
