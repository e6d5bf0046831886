#include "server/coordinator/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/logging.h"

namespace sluice {
namespace {

constexpr size_t kHeaderBytes = 8;
// A frame claiming more than this is corruption, not a record.
constexpr uint32_t kMaxRecordBytes = 512u << 20;

uint32_t Crc(const char* data, size_t n) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n)));
}

void PutU32(std::string* out, uint32_t v) {
  char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8),
               static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
  out->append(b, 4);
}

uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return u[0] | (u[1] << 8) | (u[2] << 16) |
         (static_cast<uint32_t>(u[3]) << 24);
}

// The offset of the first whole, valid record at or after `from` (non-empty
// payload within the file, CRC matching, parsing as a JournalRecord), if any.
// Zeros (a preallocated or zero-filled tail) never count as one.
std::optional<size_t> FindValidFrame(const std::string& data, size_t from) {
  for (size_t p = from; p + kHeaderBytes < data.size(); ++p) {
    const uint32_t length = GetU32(data.data() + p);
    if (length == 0 || length > kMaxRecordBytes ||
        length > data.size() - p - kHeaderBytes) {
      continue;
    }
    if (Crc(data.data() + p + kHeaderBytes, length) !=
        GetU32(data.data() + p + 4))
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
      length = GetU32(data->data() + offset);
      const uint32_t crc = GetU32(data->data() + offset + 4);
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
  {
    absl::MutexLock lock(&journal->mu_);
    journal->bytes_written_ = static_cast<int64_t>(offset);
  }
  return journal;
}

FileJournal::~FileJournal() { close(fd_); }

void FileJournal::Frame(const JournalRecord& record, std::string* out) {
  // Serialized in place after its header (a new job's record can hold a
  // million-shard manifest: no extra copies).
  const size_t header = out->size();
  out->append(kHeaderBytes, '\0');
  record.AppendToString(out);
  const size_t length = out->size() - header - kHeaderBytes;
  std::string fields;
  PutU32(&fields, static_cast<uint32_t>(length));
  PutU32(&fields, Crc(out->data() + header + kHeaderBytes, length));
  out->replace(header, kHeaderBytes, fields);
}

uint64_t FileJournal::Enqueue(const std::vector<JournalRecord>& records) {
  std::string framed;
  for (const JournalRecord& record : records) Frame(record, &framed);
  return EnqueueFramed(std::move(framed));
}

uint64_t FileJournal::Enqueue(const JournalRecord& record) {
  std::string framed;
  Frame(record, &framed);
  return EnqueueFramed(std::move(framed));
}

uint64_t FileJournal::EnqueueFramed(std::string framed) {
  absl::MutexLock lock(&mu_);
  if (pending_.empty()) {
    pending_.swap(framed);
  } else {
    pending_ += framed;
  }
  return ++queued_seq_;
}

absl::Status FileJournal::WaitDurable(uint64_t my_seq) {
  absl::MutexLock lock(&mu_);
  // Group commit: whoever finds no write in progress becomes the leader and
  // writes everything queued so far with one fsync; the others wait for it.
  while (synced_seq_ < my_seq && write_status_.ok()) {
    if (writing_) {
      auto leader_done = [this, my_seq] {
        mu_.AssertHeld();
        return !writing_ || synced_seq_ >= my_seq || !write_status_.ok();
      };
      mu_.Await(absl::Condition(&leader_done));
      continue;
    }
    writing_ = true;
    std::string batch;
    batch.swap(pending_);
    const uint64_t batch_seq = queued_seq_;
    mu_.Unlock();
    absl::Status status;
    size_t done = 0;
    while (done < batch.size()) {
      const ssize_t n = write(fd_, batch.data() + done, batch.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        status = Errno("cannot write journal", path_);
        break;
      }
      done += static_cast<size_t>(n);
    }
    const absl::Time start = absl::Now();
    if (status.ok() && fdatasync(fd_) != 0)
      status = Errno("cannot fsync journal", path_);
    if (on_fsync_) on_fsync_(absl::ToDoubleSeconds(absl::Now() - start));
    mu_.Lock();
    writing_ = false;
    bytes_written_ += static_cast<int64_t>(done);
    if (!status.ok()) {
      // After a failed write the file's tail is unknown: refuse further
      // appends rather than acknowledge state that may not be durable.
      write_status_ = status;
      if (on_failure_) on_failure_(status);
    } else {
      synced_seq_ = batch_seq;
    }
  }
  return write_status_;
}

absl::Status FileJournal::Compact(const JournalRecord& snapshot) {
  std::string framed;
  Frame(snapshot, &framed);
  const std::string tmp = path_ + ".compact";
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* writing) { return !*writing; }, &writing_));
  if (!write_status_.ok()) return write_status_;
  const int fd =
      open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create compacted journal", tmp);
  size_t done = 0;
  absl::Status status;
  while (status.ok() && done < framed.size()) {
    const ssize_t n = write(fd, framed.data() + done, framed.size() - done);
    if (n < 0 && errno != EINTR)
      status = Errno("cannot write compacted journal", tmp);
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (status.ok() && fsync(fd) != 0)
    status = Errno("cannot fsync compacted journal", tmp);
  if (status.ok() && rename(tmp.c_str(), path_.c_str()) != 0) {
    status = Errno("cannot rename compacted journal over", path_);
  }
  if (!status.ok()) {
    close(fd);
    unlink(tmp.c_str());
    return status;  // the old journal stays as it was
  }
  // The rename is durable once the directory is.
  const std::string dir = path_.substr(0, path_.rfind('/'));
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  close(fd_);
  fd_ = fd;
  // Records queued but not written are contained in the snapshot.
  pending_.clear();
  synced_seq_ = queued_seq_;
  bytes_written_ = static_cast<int64_t>(framed.size());
  return absl::OkStatus();
}

uint64_t FileJournal::LastTicket() const {
  absl::MutexLock lock(&mu_);
  return queued_seq_;
}

bool FileJournal::IsDurable(uint64_t ticket) const {
  absl::MutexLock lock(&mu_);
  return synced_seq_ >= ticket;
}

int64_t FileJournal::bytes_written() const {
  absl::MutexLock lock(&mu_);
  return bytes_written_;
}

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

absl::Status MemoryJournal::Compact(const JournalRecord& snapshot) {
  absl::MutexLock lock(&mu_);
  records_ = {snapshot};
  bytes_ = static_cast<int64_t>(snapshot.ByteSizeLong());
  return absl::OkStatus();
}

std::vector<JournalRecord> MemoryJournal::records() const {
  absl::MutexLock lock(&mu_);
  return records_;
}

}  // namespace sluice
