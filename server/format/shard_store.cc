#include "server/format/shard_store.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/common/status_macros.h"

namespace sluice::dataserver {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what,
                         absl::string_view path) {
  std::string message =
      absl::StrCat(what, " shard \"", path, "\": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case ELOOP:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

// ------------------------------------------------- mappings that lose pages
//
// A mapped file that shrinks under us turns every read of the pages it lost
// into SIGBUS, which would kill the server and every stream on it. The
// handler below looks the faulting address up among the shards mapped now;
// if it is in one, it flags that shard and maps a zero page over the page
// read, so the read that faulted (libarchive's, a decoder's) goes on
// and sees zeros, and the stream reading the shard ends with DATA_LOSS at its
// next CheckIntact, before it sends anything read after the fault. A fault
// anywhere else is not ours: the previous handler (the default: a core
// dump) gets it.
//
// The table is a fixed array of slots written with atomics only, so the
// handler reads it without locks. A slot is taken by setting its `flag`,
// published by storing `begin` last, and retired by clearing `begin` first,
// then `flag`; a mapping is unmapped only after its slot is retired.

constexpr int kFaultSlots = 4096;

struct FaultSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<std::atomic<bool>*> flag{nullptr};  // null: the slot is free
};

FaultSlot g_fault_slots[kFaultSlots];
struct sigaction g_previous_sigbus;
uintptr_t g_page_size = 4096;  // set before the handler is installed

void OnSigbus(int signo, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (FaultSlot& slot : g_fault_slots) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin == 0 || address < begin) continue;
    const uintptr_t end = slot.end.load(std::memory_order_relaxed);
    if (address >= end) continue;
    std::atomic<bool>* flag = slot.flag.load(std::memory_order_acquire);
    if (flag != nullptr) flag->store(true, std::memory_order_seq_cst);
    const uintptr_t page = address & ~(g_page_size - 1);
    // Only the page read: a zero-copy payload on another lost page, still
    // in a socket's send queue, then fails in the kernel (EFAULT) rather
    // than going out as zeros.
    void* patched = mmap(reinterpret_cast<void*>(page), g_page_size, PROT_READ,
                         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (patched != MAP_FAILED)
      return;  // the faulting read runs again, on zeros
    break;
  }
  // Not a shard's page (or it could not be patched): what would have
  // happened without this handler.
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    if (g_previous_sigbus.sa_sigaction != nullptr) {
      g_previous_sigbus.sa_sigaction(signo, info, context);
      return;
    }
  } else if (g_previous_sigbus.sa_handler != SIG_DFL &&
             g_previous_sigbus.sa_handler != SIG_IGN) {
    g_previous_sigbus.sa_handler(signo);
    return;
  }
  signal(SIGBUS, SIG_DFL);  // returning re-runs the access: default action
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page_size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction action = {};
    action.sa_sigaction = &OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &g_previous_sigbus);
  });
}

// The slot now watching [begin, end), or -1 when all are taken (the mapping
// is then unprotected, as before this table existed; logged once).
int WatchMapping(const void* begin, size_t size, std::atomic<bool>* flag) {
  InstallSigbusHandler();
  for (int i = 0; i < kFaultSlots; ++i) {
    std::atomic<bool>* expected = nullptr;
    if (!g_fault_slots[i].flag.compare_exchange_strong(expected, flag))
      continue;
    FaultSlot& slot = g_fault_slots[i];
    slot.end.store(reinterpret_cast<uintptr_t>(begin) + size,
                   std::memory_order_relaxed);
    slot.begin.store(reinterpret_cast<uintptr_t>(begin),
                     std::memory_order_release);
    return i;
  }
  static std::once_flag warned;
  std::call_once(warned, [] {
    std::fprintf(
        stderr,
        "warning: more than %d shards mapped at once; the rest are not "
        "protected against being truncated while served\n",
        kFaultSlots);
  });
  return -1;
}

void UnwatchMapping(int slot) {
  if (slot < 0) return;
  g_fault_slots[slot].begin.store(0, std::memory_order_release);
  g_fault_slots[slot].flag.store(nullptr, std::memory_order_release);
}

bool SameTime(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

std::string VersionOf(const struct stat& st) {
  return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":",
                      st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ShardData>> ShardData::Map(
    int fd, std::string path) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, "stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("shard \"", path, "\" is not a regular file"));
  }
  std::shared_ptr<ShardData> data(new ShardData());
  data->path_ = std::move(path);
  data->version_ = VersionOf(st);
  data->size_ = static_cast<size_t>(st.st_size);
  if (data->size_ > 0) {
    void* addr = mmap(nullptr, data->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      close(fd);
      return ErrnoStatus(err, "map", data->path_);
    }
    // Shards are read front to back; let the kernel read ahead.
    madvise(addr, data->size_, MADV_SEQUENTIAL);
    data->data_ = static_cast<const char*>(addr);
    data->mapped_ = true;
    data->fault_slot_ = WatchMapping(addr, data->size_, &data->faulted_);
  }
  data->fd_ = fd;
  data->mtime_ = st.st_mtim;
  return std::shared_ptr<const ShardData>(std::move(data));
}

absl::Status ShardData::CheckIntact() const {
  if (fd_ < 0) return absl::OkStatus();
  const char* kAdvice =
      " (shards must not be rewritten in place while served: write a new file "
      "and rename it over the old one)";
  if (faulted_.load()) {
    return absl::DataLossError(
        absl::StrCat("shard \"", path_,
                     "\" was truncated while being served: bytes "
                     "it had are gone",
                     kAdvice));
  }
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoStatus(errno, "stat", path_);
  if (static_cast<size_t>(st.st_size) != size_) {
    return absl::DataLossError(absl::StrCat(
        "shard \"", path_, "\" changed while being served: ", size_,
        " bytes when opened, ", st.st_size, " now", kAdvice));
  }
  // Not the change time: unlinking the file (the cache evicting it, a
  // rename over it) changes that, and the mapping stays good.
  if (!SameTime(st.st_mtim, mtime_)) {
    return absl::DataLossError(
        absl::StrCat("shard \"", path_,
                     "\" changed while being served: modified since it "
                     "was opened",
                     kAdvice));
  }
  return absl::OkStatus();
}

std::shared_ptr<const ShardData> ShardData::FromString(std::string bytes,
                                                       std::string path) {
  std::shared_ptr<ShardData> data(new ShardData());
  data->owned_ = std::move(bytes);
  data->data_ = data->owned_.data();
  data->size_ = data->owned_.size();
  data->version_ = absl::StrCat("mem:", data->size_);
  data->path_ = std::move(path);
  return data;
}

ShardData::~ShardData() {
  UnwatchMapping(fault_slot_);
  if (mapped_) munmap(const_cast<char*>(data_), size_);
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::unique_ptr<LocalShardStore>> LocalShardStore::Create(
    const std::vector<std::string>& roots) {
  ASSIGN_OR_RETURN(PathRoots resolved, PathRoots::Create(roots, "--roots"));
  if (resolved.roots().empty()) {
    return absl::InvalidArgumentError(
        "--roots is empty: name the directories shards may be read from");
  }
  return std::unique_ptr<LocalShardStore>(
      new LocalShardStore(std::move(resolved)));
}

absl::StatusOr<std::string> LocalShardStore::Resolve(
    absl::string_view url) const {
  absl::string_view path = url;
  if (absl::ConsumePrefix(&path, "file://")) {
    // file:///abs or file://localhost/abs; other hosts are not local.
    if (!absl::ConsumePrefix(&path, "localhost") && !path.empty() &&
        path[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard url \"", url, "\": file:// URLs must name a local path"));
    }
  } else if (absl::StrContains(path, "://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard url \"", url,
                     "\": unsupported scheme (this store serves local paths)"));
  }
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("shard url \"", url, "\" is not an absolute path"));
  }
  if (absl::StrContains(path, std::string(1, '\0'))) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard url \"", url, "\" contains a NUL byte"));
  }
  return roots_.Resolve(path, absl::StrCat("shard \"", url, "\""));
}

absl::StatusOr<std::shared_ptr<const ShardData>> LocalShardStore::Open(
    const ShardRef& shard) {
  const std::string& url = shard.url;
  // A shard opened before is reused while the URL names the same file: the
  // file it resolved to (inside the roots) then, whatever the path's
  // symlinks do now.
  absl::string_view named = url;
  if (absl::ConsumePrefix(&named, "file://"))
    absl::ConsumePrefix(&named, "localhost");
  struct stat st;
  const bool known =
      !named.empty() && stat(std::string(named).c_str(), &st) == 0;
  if (known) {
    const std::string version = VersionOf(st);
    absl::MutexLock lock(&mu_);
    for (auto it = recent_.begin(); it != recent_.end(); ++it) {
      if (it->first != url) continue;
      if (it->second->version() != version) {
        recent_.erase(it);
        break;
      }
      recent_.splice(recent_.begin(), recent_, it);
      return recent_.front().second;
    }
  }
  ASSIGN_OR_RETURN(std::string path, Resolve(url));
  // O_NOFOLLOW: the resolved path has no symlinks left; one appearing now
  // is a race with someone swapping files, and is refused.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(errno, "open", url);
  ASSIGN_OR_RETURN(std::shared_ptr<const ShardData> data,
                   ShardData::Map(fd, url));
  absl::MutexLock lock(&mu_);
  for (auto it = recent_.begin(); it != recent_.end(); ++it) {
    if (it->first == url) {
      recent_.erase(it);
      break;
    }
  }
  recent_.emplace_front(url, data);
  if (recent_.size() > kRecentShards) recent_.pop_back();
  return data;
}

}  // namespace sluice::dataserver
