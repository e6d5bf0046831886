#include "server/dataserver/shard_store.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
  data->version_ =
      absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":",
                   st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
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
  }
  close(fd);
  return std::shared_ptr<const ShardData>(std::move(data));
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
  if (mapped_) munmap(const_cast<char*>(data_), size_);
}

std::string NormalizeAbsolutePath(absl::string_view path) {
  std::vector<absl::string_view> parts;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (absl::string_view part : parts) absl::StrAppend(&out, "/", part);
  return out.empty() ? "/" : out;
}

absl::StatusOr<std::unique_ptr<LocalShardStore>> LocalShardStore::Create(
    const std::vector<std::string>& roots) {
  std::vector<std::string> resolved;
  for (const std::string& root : roots) {
    if (root.empty()) continue;
    char buf[PATH_MAX];
    if (realpath(root.c_str(), buf) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--roots: \"", root, "\": ", std::strerror(errno)));
    }
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--roots: \"", root, "\" is not a directory"));
    }
    resolved.emplace_back(buf);
  }
  if (resolved.empty()) {
    return absl::InvalidArgumentError(
        "--roots is empty: name the directories shards may be read from");
  }
  return std::unique_ptr<LocalShardStore>(
      new LocalShardStore(std::move(resolved)));
}

bool LocalShardStore::UnderRoot(absl::string_view path) const {
  for (const std::string& root : roots_) {
    if (root == "/") return true;
    if (path == root) return true;
    if (absl::StartsWith(path, root) && path[root.size()] == '/') return true;
  }
  return false;
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
    return absl::InvalidArgumentError(absl::StrCat(
        "shard url \"", url,
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
  std::string lexical = NormalizeAbsolutePath(path);
  if (!UnderRoot(lexical)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shard \"", url, "\" is outside the data server's --roots"));
  }
  char buf[PATH_MAX];
  if (realpath(lexical.c_str(), buf) == nullptr) {
    return ErrnoStatus(errno, "resolve", url);
  }
  if (!UnderRoot(buf)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shard \"", url,
        "\" resolves (through a symlink) outside the data server's --roots"));
  }
  return std::string(buf);
}

absl::StatusOr<std::shared_ptr<const ShardData>> LocalShardStore::Open(
    const ShardRef& shard) {
  const std::string& url = shard.url;
  ASSIGN_OR_RETURN(std::string path, Resolve(url));
  // O_NOFOLLOW: the resolved path has no symlinks left; one appearing now
  // is a race with someone swapping files, and is refused.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(errno, "open", url);
  return ShardData::Map(fd, url);
}

}  // namespace sluice::dataserver
