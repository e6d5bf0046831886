#include "server/dataserver/shard_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "server/common/logging.h"
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

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kDigits[digest[i] >> 4]);
    out.push_back(kDigits[digest[i] & 15]);
  }
  return out;
}

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

// "sha256:<hex>" -> "<hex>" (lowercased); empty for an empty checksum.
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

}  // namespace

// A pinned shard: the mapping plus the pin, released when the last copy of
// the pointer handed out goes away.
struct ShardCachePin {
  std::shared_ptr<const ShardData> data;
  std::function<void()> unpin;
  ~ShardCachePin() {
    if (unpin) unpin();
  }
};

absl::StatusOr<std::shared_ptr<ShardCache>> ShardCache::Create(
    ShardCacheOptions options, std::unique_ptr<RemoteFetcher> fetcher) {
  if (options.dir.empty())
    return absl::InvalidArgumentError("--cache_dir is empty");
  if (options.max_bytes < 0) {
    return absl::InvalidArgumentError(
        "--cache_bytes must be >= 0 (0 = unbounded)");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cache_dir \"", options.dir, "\": ", ec.message()));
  }
  if (access(options.dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cache_dir \"", options.dir,
                     "\" is not writable: ", std::strerror(errno)));
  }
  if (options.download_threads < 1) options.download_threads = 1;
  if (options.metrics != nullptr) {
    // Every reason exported from the start (at 0), so rates and alerts see
    // the first failure as an increase.
    for (FetchFailure f : AllFetchFailures()) {
      options.metrics->DownloadFailures(FetchFailureLabel(f));
    }
  }
  std::shared_ptr<ShardCache> cache(
      new ShardCache(std::move(options), std::move(fetcher)));
  RETURN_IF_ERROR(cache->Scan());
  return cache;
}

ShardCache::ShardCache(ShardCacheOptions options,
                       std::unique_ptr<RemoteFetcher> fetcher)
    : options_(std::move(options)),
      fetcher_(std::move(fetcher)),
      downloads_(std::make_unique<ThreadPool>(options_.download_threads)) {}

ShardCache::~ShardCache() {
  Shutdown();
  downloads_.reset();  // runs what is queued (failing fast), then joins
}

void ShardCache::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
  }
  fetcher_->Cancel();
}

std::string ShardCache::PathFor(const std::string& url) const {
  return absl::StrCat(options_.dir, "/", Sha256Hex(url), ".shard");
}

absl::Status ShardCache::Scan() {
  DIR* dir = opendir(options_.dir.c_str());
  if (dir == nullptr) return ErrnoError("open --cache_dir", options_.dir);
  const std::string host = HostName();
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  std::map<std::string, int64_t> shards;  // hash -> mtime
  std::vector<std::string> metas;
  int removed = 0;
  while (dirent* d = readdir(dir)) {
    const std::string name = d->d_name;
    const std::string path = absl::StrCat(options_.dir, "/", name);
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
        if (unlink(path.c_str()) == 0) ++removed;
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

  std::vector<std::pair<int64_t, std::string>> adopted;  // (mtime, url)
  absl::MutexLock lock(&mu_);
  for (const std::string& hash : metas) {
    const std::string meta_path =
        absl::StrCat(options_.dir, "/", hash, ".meta");
    const std::string shard_path =
        absl::StrCat(options_.dir, "/", hash, ".shard");
    std::optional<Meta> meta = ReadMeta(meta_path);
    auto shard = shards.find(hash);
    struct stat st;
    bool shard_ok = shard != shards.end() && stat(shard_path.c_str(), &st) == 0;
    if (meta.has_value() && shard_ok && Sha256Hex(meta->url) == hash &&
        st.st_size == meta->size) {
      auto entry = std::make_shared<Entry>();
      entry->url = meta->url;
      entry->size = meta->size;
      entry->sha256 = meta->sha256;
      entry->ready = true;
      entries_[meta->url] = entry;
      adopted.emplace_back(shard->second, meta->url);
      shards.erase(shard);
      continue;
    }
    struct stat mst;
    if (!shard_ok && stat(meta_path.c_str(), &mst) == 0 &&
        now - mst.st_mtime < kInstallGraceSeconds) {
      continue;  // another process may be installing it right now
    }
    if (unlink(meta_path.c_str()) == 0) ++removed;
    if (shard_ok && unlink(shard_path.c_str()) == 0) ++removed;
    if (shard != shards.end()) shards.erase(shard);
  }
  for (const auto& [hash, mtime] : shards) {  // .shard without .meta
    if (now - mtime < kInstallGraceSeconds) continue;
    if (unlink(absl::StrCat(options_.dir, "/", hash, ".shard").c_str()) == 0)
      ++removed;
  }
  std::sort(adopted.begin(), adopted.end());
  for (const auto& [mtime, url] : adopted) {
    Entry& e = *entries_[url];
    e.lru = lru_.insert(lru_.end(), url);
    bytes_ += e.size;
  }
  LogInfo(
      "shard cache %s: %d cached shards (%d bytes) adopted, %d leftover files "
      "removed",
      options_.dir, static_cast<int>(adopted.size()), bytes_, removed);
  EvictLocked();
  UpdateGaugeLocked();
  return absl::OkStatus();
}

void ShardCache::UpdateGaugeLocked() {
  if (options_.metrics != nullptr)
    options_.metrics->cache_bytes.Set(static_cast<double>(bytes_));
}

int64_t ShardCache::bytes_in_use() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

std::vector<std::string> ShardCache::CachedUrls() const {
  absl::MutexLock lock(&mu_);
  return std::vector<std::string>(lru_.begin(), lru_.end());
}

std::shared_ptr<const ShardData> ShardCache::Pinned(
    const std::shared_ptr<Entry>& entry,
    std::shared_ptr<const ShardData> data) {
  ++entry->pins;
  auto pin = std::make_shared<ShardCachePin>();
  pin->data = std::move(data);
  std::weak_ptr<ShardCache> weak = weak_from_this();
  pin->unpin = [weak, entry] {
    if (auto cache = weak.lock()) cache->Unpin(entry);
  };
  const ShardData* raw = pin->data.get();
  // The aliasing constructor (C++17's takes the owner by const reference).
  return std::shared_ptr<const ShardData>(pin, raw);
}

absl::StatusOr<std::shared_ptr<const ShardData>> ShardCache::PinLocked(
    const std::shared_ptr<Entry>& entry) {
  const std::string path = PathFor(entry->url);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cached shard \"", entry->url, "\" vanished"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const ShardData> data,
                   ShardData::Map(fd, entry->url));
  if (data->size() != entry->size) {
    return absl::NotFoundError(
        absl::StrCat("cached shard \"", entry->url, "\" changed size"));
  }
  lru_.splice(lru_.end(), lru_, entry->lru);
  return Pinned(entry, std::move(data));
}

void ShardCache::Unpin(const std::shared_ptr<Entry>& entry) {
  absl::MutexLock lock(&mu_);
  --entry->pins;
  if (entry->pins == 0) EvictLocked();
}

void ShardCache::DropLocked(const std::shared_ptr<Entry>& entry,
                            bool remove_files) {
  auto it = entries_.find(entry->url);
  if (it == entries_.end() || it->second != entry) return;
  if (entry->ready) {
    lru_.erase(entry->lru);
    bytes_ -= entry->size;
    entry->ready = false;
  }
  if (remove_files) {
    const std::string shard_path = PathFor(entry->url);
    const std::string meta_path =
        shard_path.substr(0, shard_path.size() - 6) + ".meta";
    // .shard first: a crash in between leaves a .meta alone, which start-up
    // removes; never a .shard without its size record being checked.
    unlink(shard_path.c_str());
    unlink(meta_path.c_str());
  }
  entries_.erase(it);
  UpdateGaugeLocked();
}

void ShardCache::EvictLocked() {
  if (options_.max_bytes > 0) {
    for (auto it = lru_.begin();
         it != lru_.end() && bytes_ + reserved_ > options_.max_bytes;) {
      std::shared_ptr<Entry> entry = entries_[*it];
      ++it;  // DropLocked erases the entry's node
      if (entry->pins > 0) continue;
      DropLocked(entry, /*remove_files=*/true);
      if (options_.metrics != nullptr)
        options_.metrics->cache_evictions.Increment();
    }
  }
  if (options_.min_free_bytes <= 0) return;
  int64_t free = FreeBytes();
  if (free < 0) return;
  const int64_t want = options_.min_free_bytes + reserved_;
  if (free >= want) return;
  for (auto it = lru_.begin(); it != lru_.end() && free < want;) {
    std::shared_ptr<Entry> entry = entries_[*it];
    ++it;
    if (entry->pins > 0) continue;
    free += entry->size;  // unlinked and unmapped: its blocks are free again
    DropLocked(entry, /*remove_files=*/true);
    if (options_.metrics != nullptr)
      options_.metrics->cache_evictions.Increment();
  }
  if (free < want && !warned_full_) {
    warned_full_ = true;
    LogWarning(
        "shard cache %s: %d bytes free on its filesystem, below "
        "--cache_min_free_bytes "
        "(%d) plus downloads in flight, with nothing left to evict",
        options_.dir, free, options_.min_free_bytes);
  } else if (free >= want) {
    warned_full_ = false;
  }
}

int64_t ShardCache::FreeBytes() const {
  if (options_.free_bytes) return options_.free_bytes(options_.dir);
  struct statvfs st;
  if (statvfs(options_.dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

bool ShardCache::AdoptFromDiskLocked(const ShardRef& shard,
                                     const std::string& expected_sha) {
  const std::string shard_path = PathFor(shard.url);
  const std::string meta_path =
      shard_path.substr(0, shard_path.size() - 6) + ".meta";
  std::optional<Meta> meta = ReadMeta(meta_path);
  struct stat st;
  if (!meta.has_value() || meta->url != shard.url ||
      stat(shard_path.c_str(), &st) != 0 || st.st_size != meta->size ||
      (shard.size_bytes > 0 && meta->size != shard.size_bytes) ||
      (!expected_sha.empty() && meta->sha256 != expected_sha)) {
    return false;
  }
  auto entry = std::make_shared<Entry>();
  entry->url = shard.url;
  entry->size = meta->size;
  entry->sha256 = meta->sha256;
  entry->ready = true;
  entry->lru = lru_.insert(lru_.end(), shard.url);
  entries_[shard.url] = entry;
  bytes_ += entry->size;
  UpdateGaugeLocked();
  return true;
}

void ShardCache::OpenAsync(const ShardRef& shard, OpenCallback done) {
  absl::StatusOr<std::string> expected_sha = ExpectedSha256(shard);
  if (!expected_sha.ok()) {
    done(expected_sha.status());
    return;
  }
  if (absl::StatusOr<std::string> http = fetcher_->HttpUrl(shard.url);
      !http.ok()) {
    done(http.status());
    return;
  }
  absl::StatusOr<std::shared_ptr<const ShardData>> hit;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      hit = absl::UnavailableError("data server is shutting down");
    } else {
      auto it = entries_.find(shard.url);
      std::shared_ptr<Entry> entry =
          it == entries_.end() ? nullptr : it->second;
      if (entry != nullptr && entry->ready &&
          ((shard.size_bytes > 0 && entry->size != shard.size_bytes) ||
           (!expected_sha->empty() && entry->sha256 != *expected_sha))) {
        // The manifest describes another version than the cached one.
        DropLocked(entry, /*remove_files=*/true);
        entry = nullptr;
      }
      if (entry == nullptr && AdoptFromDiskLocked(shard, *expected_sha)) {
        entry = entries_[shard.url];
      }
      if (entry != nullptr && entry->ready) {
        hit = PinLocked(entry);
        if (!hit.ok()) {  // evicted underneath us by a process sharing the dir
          DropLocked(entry, /*remove_files=*/false);
          entry = nullptr;
        }
      }
      if (entry == nullptr || !entry->ready) {
        if (options_.metrics != nullptr)
          options_.metrics->cache_misses.Increment();
        if (entry == nullptr) {
          entry = std::make_shared<Entry>();
          entry->url = shard.url;
          entry->downloading = true;
          entries_[shard.url] = entry;
          entry->waiters.push_back(std::move(done));
          StartDownloadLocked(shard);
        } else {
          entry->waiters.push_back(std::move(done));
        }
        return;
      }
      if (options_.metrics != nullptr) options_.metrics->cache_hits.Increment();
    }
  }
  done(std::move(hit));
}

absl::StatusOr<std::shared_ptr<const ShardData>> ShardCache::Open(
    const ShardRef& shard) {
  absl::Notification ready;
  absl::StatusOr<std::shared_ptr<const ShardData>> result;
  OpenAsync(shard, [&](absl::StatusOr<std::shared_ptr<const ShardData>> r) {
    result = std::move(r);
    ready.Notify();
  });
  ready.WaitForNotification();
  return result;
}

void ShardCache::Prefetch(const ShardRef& shard) {
  absl::StatusOr<std::string> expected_sha = ExpectedSha256(shard);
  if (!expected_sha.ok() || !fetcher_->HttpUrl(shard.url).ok()) return;
  absl::MutexLock lock(&mu_);
  if (shut_down_ || entries_.count(shard.url) > 0) return;
  if (AdoptFromDiskLocked(shard, *expected_sha)) return;
  if (queued_prefetches_ >= options_.max_queued_prefetches) return;
  auto entry = std::make_shared<Entry>();
  entry->url = shard.url;
  entry->downloading = true;
  entry->prefetch = true;
  ++queued_prefetches_;
  entries_[shard.url] = entry;
  StartDownloadLocked(shard);
}

void ShardCache::StartDownloadLocked(const ShardRef& shard) {
  reserved_ += std::max<int64_t>(0, shard.size_bytes);
  EvictLocked();
  downloads_->Schedule([this, shard] { Download(shard); });
}

void ShardCache::Download(const ShardRef& shard) {
  const absl::Time start = absl::Now();
  FetchFailure failure = FetchFailure::kNone;
  std::string sha256;
  absl::StatusOr<std::shared_ptr<const ShardData>> data =
      DownloadToCache(shard, &failure, &sha256);
  std::vector<OpenCallback> waiters;
  std::vector<absl::StatusOr<std::shared_ptr<const ShardData>>> results;
  {
    absl::MutexLock lock(&mu_);
    reserved_ -= std::max<int64_t>(0, shard.size_bytes);
    std::shared_ptr<Entry> entry = entries_[shard.url];
    if (entry->prefetch) --queued_prefetches_;
    entry->downloading = false;
    waiters = std::move(entry->waiters);
    entry->waiters.clear();
    DataServerMetrics* metrics = options_.metrics;
    if (data.ok()) {
      entry->ready = true;
      entry->size = (*data)->size();
      entry->sha256 = sha256;
      entry->lru = lru_.insert(lru_.end(), shard.url);
      bytes_ += entry->size;
      if (metrics != nullptr) {
        metrics->cache_downloaded_bytes.Increment(
            static_cast<double>(entry->size));
        metrics->cache_download_seconds.Observe(
            absl::ToDoubleSeconds(absl::Now() - start));
      }
      for (size_t i = 0; i < waiters.size(); ++i)
        results.push_back(Pinned(entry, *data));
      data = absl::CancelledError(
          "");  // drop the unpinned mapping before eviction
      EvictLocked();
      UpdateGaugeLocked();
    } else {
      entries_.erase(shard.url);
      if (metrics != nullptr)
        metrics->DownloadFailures(FetchFailureLabel(failure)).Increment();
      LogWarning("%s", data.status().ToString());
      for (size_t i = 0; i < waiters.size(); ++i)
        results.push_back(data.status());
    }
  }
  for (size_t i = 0; i < waiters.size(); ++i) waiters[i](std::move(results[i]));
}

absl::StatusOr<std::shared_ptr<const ShardData>> ShardCache::DownloadToCache(
    const ShardRef& shard, FetchFailure* failure, std::string* sha256) {
  const std::string hash = Sha256Hex(shard.url);
  int64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = ++temp_counter_;
  }
  static const std::string host = HostName();
  const std::string temp =
      absl::StrCat(options_.dir, "/", kTempPrefix, getpid(), "-", n, "-shard-",
                   hash, "@", host);
  const std::string temp_meta =
      absl::StrCat(options_.dir, "/", kTempPrefix, getpid(), "-", n, "-meta-",
                   hash, "@", host);
  const std::string final_shard =
      absl::StrCat(options_.dir, "/", hash, ".shard");
  const std::string final_meta = absl::StrCat(options_.dir, "/", hash, ".meta");
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
      fetcher_->Fetch(shard.url, fd, /*sha256=*/!expected->empty(), failure);
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
  absl::Status synced = FsyncDir(options_.dir);
  if (!synced.ok()) LogWarning("%s", synced.ToString());
  return ShardData::Map(fd, shard.url);
}

// ------------------------------------------------------------ composite store

CompositeShardStore::~CompositeShardStore() {
  if (cache_ != nullptr) cache_->Shutdown();
}

bool CompositeShardStore::IsRemote(absl::string_view url) const {
  return RemoteFetcher::IsRemoteUrl(url);
}

absl::Status CompositeShardStore::Unavailable(absl::string_view url) const {
  if (IsRemote(url)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard \"", url,
                     "\" is remote (http/https/s3) but this data server has no "
                     "--cache_dir to download it to"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("shard \"", url,
                   "\" is a local path but this data server has no --roots"));
}

absl::StatusOr<std::shared_ptr<const ShardData>> CompositeShardStore::Open(
    const ShardRef& shard) {
  if (IsRemote(shard.url)) {
    if (cache_ == nullptr) return Unavailable(shard.url);
    return cache_->Open(shard);
  }
  if (local_ == nullptr) return Unavailable(shard.url);
  return local_->Open(shard);
}

void CompositeShardStore::OpenAsync(const ShardRef& shard, OpenCallback done) {
  if (IsRemote(shard.url) && cache_ != nullptr) {
    cache_->OpenAsync(shard, std::move(done));
    return;
  }
  done(Open(shard));
}

}  // namespace sluice::dataserver
