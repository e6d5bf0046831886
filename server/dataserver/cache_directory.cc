#include "server/dataserver/cache_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/common/logging.h"
#include "server/common/sha256.h"
#include "server/common/status_macros.h"

namespace sluice::dataserver {
namespace {

constexpr char kMetaMagic[] = "sluice-cache-v1";
constexpr char kTempPrefix[] = ".tmp-";
// Temp files of another host (shared directory) are removed only when this
// old; those of a dead local process at once.
constexpr int64_t kForeignTempMaxAgeSeconds = 24 * 3600;
// An entry half installed by another process (.meta renamed, .shard not yet)
// is left alone this long.
constexpr int64_t kInstallGraceSeconds = 60;

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  std::string host(buf);
  // '@' separates the host in temp names; '/' cannot appear in a name.
  std::replace(host.begin(), host.end(), '/', '_');
  std::replace(host.begin(), host.end(), '@', '_');
  return host;
}

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " \"", path, "\": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t w = write(fd, data.data(), data.size());
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", path);
    }
    data.remove_prefix(static_cast<size_t>(w));
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open directory", dir);
  int rc = fsync(fd);
  close(fd);
  if (rc != 0) return ErrnoError("fsync directory", dir);
  return absl::OkStatus();
}

struct Meta {
  std::string url;
  int64_t size = -1;
  std::string sha256;
};

std::optional<Meta> ReadMeta(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string magic, size;
  Meta meta;
  if (!std::getline(in, magic) || magic != kMetaMagic ||
      !std::getline(in, meta.url) || !std::getline(in, size) ||
      !std::getline(in, meta.sha256) || !absl::SimpleAtoi(size, &meta.size) ||
      meta.size < 0) {
    return std::nullopt;
  }
  return meta;
}

}  // namespace

absl::StatusOr<std::string> ExpectedSha256(const ShardRef& shard) {
  if (shard.checksum.empty()) return std::string();
  absl::string_view hex = shard.checksum;
  if (!absl::ConsumePrefix(&hex, "sha256:") || hex.size() != 64 ||
      !std::all_of(hex.begin(), hex.end(), [](char c) {
        return absl::ascii_isxdigit(static_cast<unsigned char>(c));
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard \"", shard.url, "\": checksum \"", shard.checksum,
                     "\" is not \"sha256:<64 hex digits>\""));
  }
  return absl::AsciiStrToLower(hex);
}

std::string CacheDirectory::ShardPath(const std::string& url) const {
  return absl::StrCat(dir_, "/", Sha256Hex(url), ".shard");
}

absl::StatusOr<CacheDirectory::ScanResult> CacheDirectory::Scan() const {
  DIR* dir = opendir(dir_.c_str());
  if (dir == nullptr) return ErrnoError("open --cache_dir", dir_);
  const std::string host = HostName();
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  std::map<std::string, int64_t> shards;  // hash -> mtime
  std::vector<std::string> metas;
  ScanResult result;
  while (dirent* d = readdir(dir)) {
    const std::string name = d->d_name;
    const std::string path = absl::StrCat(dir_, "/", name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (absl::StartsWith(name, kTempPrefix)) {
      // .tmp-<pid>-<n>-<kind>-<hash>@<host>
      std::vector<std::string> parts = absl::StrSplit(name.substr(5), '-');
      size_t at = name.rfind('@');
      int64_t pid = 0;
      bool ours = at != std::string::npos && name.substr(at + 1) == host;
      bool dead = ours && !parts.empty() && absl::SimpleAtoi(parts[0], &pid) &&
                  pid > 0 &&
                  (pid == getpid() ||
                   (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH));
      if (dead || now - st.st_mtime > kForeignTempMaxAgeSeconds) {
        if (unlink(path.c_str()) == 0) ++result.removed;
      }
      continue;
    }
    if (absl::EndsWith(name, ".shard")) {
      shards[name.substr(0, name.size() - 6)] = st.st_mtime;
    } else if (absl::EndsWith(name, ".meta")) {
      metas.push_back(name.substr(0, name.size() - 5));
    }
  }
  closedir(dir);

  std::vector<std::pair<int64_t, Record>> complete;  // (mtime, record)
  for (const std::string& hash : metas) {
    const std::string meta_path = absl::StrCat(dir_, "/", hash, ".meta");
    const std::string shard_path = absl::StrCat(dir_, "/", hash, ".shard");
    std::optional<Meta> meta = ReadMeta(meta_path);
    auto shard = shards.find(hash);
    struct stat st;
    bool shard_ok = shard != shards.end() && stat(shard_path.c_str(), &st) == 0;
    if (meta.has_value() && shard_ok && Sha256Hex(meta->url) == hash &&
        st.st_size == meta->size) {
      complete.emplace_back(shard->second,
                            Record{meta->url, meta->size, meta->sha256});
      shards.erase(shard);
      continue;
    }
    struct stat mst;
    if (!shard_ok && stat(meta_path.c_str(), &mst) == 0 &&
        now - mst.st_mtime < kInstallGraceSeconds) {
      continue;  // another process may be installing it right now
    }
    if (unlink(meta_path.c_str()) == 0) ++result.removed;
    if (shard_ok && unlink(shard_path.c_str()) == 0) ++result.removed;
    if (shard != shards.end()) shards.erase(shard);
  }
  for (const auto& [hash, mtime] : shards) {  // .shard without .meta
    if (now - mtime < kInstallGraceSeconds) continue;
    if (unlink(absl::StrCat(dir_, "/", hash, ".shard").c_str()) == 0)
      ++result.removed;
  }
  std::stable_sort(complete.begin(), complete.end(),
                   [](const auto& a, const auto& b) {
                     return a.first != b.first ? a.first < b.first
                                               : a.second.url < b.second.url;
                   });
  for (auto& [mtime, record] : complete) {
    result.complete.push_back(std::move(record));
  }
  return result;
}

std::optional<CacheDirectory::Record> CacheDirectory::Find(
    const ShardRef& shard, const std::string& expected_sha) const {
  const std::string shard_path = ShardPath(shard.url);
  const std::string meta_path =
      shard_path.substr(0, shard_path.size() - 6) + ".meta";
  std::optional<Meta> meta = ReadMeta(meta_path);
  struct stat st;
  if (!meta.has_value() || meta->url != shard.url ||
      stat(shard_path.c_str(), &st) != 0 || st.st_size != meta->size ||
      (shard.size_bytes > 0 && meta->size != shard.size_bytes) ||
      (!expected_sha.empty() && meta->sha256 != expected_sha)) {
    return std::nullopt;
  }
  return Record{meta->url, meta->size, meta->sha256};
}

absl::StatusOr<std::shared_ptr<const ShardData>> CacheDirectory::Map(
    const Record& record) const {
  const std::string path = ShardPath(record.url);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cached shard \"", record.url, "\" vanished"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const ShardData> data,
                   ShardData::Map(fd, record.url));
  if (data->size() != record.size) {
    return absl::NotFoundError(
        absl::StrCat("cached shard \"", record.url, "\" changed size"));
  }
  return data;
}

void CacheDirectory::Remove(const std::string& url) const {
  const std::string shard_path = ShardPath(url);
  const std::string meta_path =
      shard_path.substr(0, shard_path.size() - 6) + ".meta";
  unlink(shard_path.c_str());
  unlink(meta_path.c_str());
}

absl::StatusOr<std::shared_ptr<const ShardData>> CacheDirectory::Install(
    const ShardRef& shard, int64_t n, const Fetch& fetch, FetchFailure* failure,
    std::string* sha256) const {
  const std::string hash = Sha256Hex(shard.url);
  static const std::string host = HostName();
  const std::string temp = absl::StrCat(dir_, "/", kTempPrefix, getpid(), "-",
                                        n, "-shard-", hash, "@", host);
  const std::string temp_meta = absl::StrCat(dir_, "/", kTempPrefix, getpid(),
                                             "-", n, "-meta-", hash, "@", host);
  const std::string final_shard = absl::StrCat(dir_, "/", hash, ".shard");
  const std::string final_meta = absl::StrCat(dir_, "/", hash, ".meta");
  auto disk_error = [&](absl::Status status) {
    *failure = FetchFailure::kDisk;
    unlink(temp.c_str());
    unlink(temp_meta.c_str());
    return status;
  };
  int fd = open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return disk_error(ErrnoError("create", temp));
  auto reject = [&](absl::Status status) {
    close(fd);
    unlink(temp.c_str());
    return status;
  };
  absl::StatusOr<std::string> expected = ExpectedSha256(shard);
  if (!expected.ok()) return reject(expected.status());
  // Hashing costs CPU at download speed: only when the manifest has a sum.
  absl::StatusOr<FetchResult> fetched =
      fetch(fd, /*sha256=*/!expected->empty(), failure);
  if (!fetched.ok()) return reject(fetched.status());
  if (shard.size_bytes > 0 && fetched->bytes != shard.size_bytes) {
    *failure = FetchFailure::kSizeMismatch;
    return reject(absl::DataLossError(
        absl::StrCat("shard \"", shard.url, "\": downloaded ", fetched->bytes,
                     " bytes but the manifest says size_bytes ",
                     shard.size_bytes, "; not cached")));
  }
  if (!expected->empty() && *expected != fetched->sha256) {
    *failure = FetchFailure::kChecksumMismatch;
    return reject(absl::DataLossError(absl::StrCat(
        "shard \"", shard.url,
        "\": downloaded content has sha256:", fetched->sha256,
        " but the manifest says ", shard.checksum, "; not cached")));
  }
  *sha256 = fetched->sha256;
  if (fsync(fd) != 0) {
    close(fd);
    return disk_error(ErrnoError("fsync", temp));
  }
  {
    int mfd =
        open(temp_meta.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (mfd < 0) {
      close(fd);
      return disk_error(ErrnoError("create", temp_meta));
    }
    absl::Status written =
        WriteAll(mfd,
                 absl::StrCat(kMetaMagic, "\n", shard.url, "\n", fetched->bytes,
                              "\n", fetched->sha256, "\n"),
                 temp_meta);
    if (written.ok() && fsync(mfd) != 0)
      written = ErrnoError("fsync", temp_meta);
    close(mfd);
    if (!written.ok()) {
      close(fd);
      return disk_error(written);
    }
  }
  // .meta before .shard: a .shard under its final name always has its record.
  if (rename(temp_meta.c_str(), final_meta.c_str()) != 0 ||
      rename(temp.c_str(), final_shard.c_str()) != 0) {
    absl::Status status = ErrnoError("install", final_shard);
    close(fd);
    return disk_error(status);
  }
  absl::Status synced = FsyncDir(dir_);
  if (!synced.ok()) LogWarning("%s", synced.ToString());
  return ShardData::Map(fd, shard.url);
}

}  // namespace sluice::dataserver
