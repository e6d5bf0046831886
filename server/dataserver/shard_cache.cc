#include "server/dataserver/shard_cache.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "server/common/logging.h"
#include "server/common/status_macros.h"

namespace sluice::dataserver {

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
  std::optional<DirLock> lock;
  if (!options.shared_dir) {
    absl::StatusOr<DirLock> held = DirLock::Acquire(options.dir, "--cache_dir");
    if (!held.ok()) {
      return absl::Status(
          held.status().code(),
          absl::StrCat(held.status().message(),
                       " (--shared_cache_dir lets processes share it)"));
    }
    lock.emplace(std::move(*held));
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
  cache->dir_lock_ = std::move(lock);
  RETURN_IF_ERROR(cache->Scan());
  return cache;
}

ShardCache::ShardCache(ShardCacheOptions options,
                       std::unique_ptr<RemoteFetcher> fetcher)
    : options_(std::move(options)),
      directory_(options_.dir),
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
  return directory_.ShardPath(url);
}

absl::Status ShardCache::Scan() {
  // The directory's I/O first, without the lock.
  ASSIGN_OR_RETURN(CacheDirectory::ScanResult scan, directory_.Scan());
  int64_t free = FreeBytes();
  absl::ReleasableMutexLock lock(&mu_);
  for (const CacheDirectory::Record& r : scan.complete) AdoptLocked(r);
  LogInfo(
      "shard cache %s: %d cached shards (%d bytes) adopted, %d leftover files "
      "removed",
      options_.dir, static_cast<int>(scan.complete.size()), bytes_,
      scan.removed);
  EvictLocked(&free);
  UpdateGaugeLocked();
  lock.Release();
  RemoveDoomed();
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

void ShardCache::Unpin(const std::shared_ptr<Entry>& entry) {
  int64_t free = FreeBytes();
  {
    absl::MutexLock lock(&mu_);
    --entry->pins;
    if (entry->pins == 0) EvictLocked(&free);
  }
  RemoveDoomed();
}

void ShardCache::DropLocked(const std::shared_ptr<Entry>& entry,
                            bool remove_files) {
  auto it = entries_.find(entry->url);
  if (it == entries_.end() || it->second != entry || entry->removing) return;
  if (entry->ready) {
    lru_.erase(entry->lru);
    bytes_ -= entry->size;
    entry->ready = false;
  }
  if (remove_files) {
    entry->removing = true;
    doomed_.push_back(entry);
  } else {
    entries_.erase(it);
  }
  UpdateGaugeLocked();
}

void ShardCache::RemoveDoomed() {
  for (;;) {
    std::vector<std::shared_ptr<Entry>> doomed;
    {
      absl::MutexLock lock(&mu_);
      doomed.swap(doomed_);
    }
    if (doomed.empty()) return;
    for (const std::shared_ptr<Entry>& entry : doomed) {
      if (options_.before_remove_for_testing)
        options_.before_remove_for_testing(entry->url);
      directory_.Remove(entry->url);
    }
    int64_t free = FreeBytes();
    absl::MutexLock lock(&mu_);
    for (const std::shared_ptr<Entry>& entry : doomed) {
      entry->removing = false;
      auto it = entries_.find(entry->url);
      if (it == entries_.end() || it->second != entry) continue;
      if (entry->waiters.empty()) {
        entries_.erase(it);
        continue;
      }
      // Opens arrived while the files went: download the shard afresh.
      const ShardRef wanted = *entry->wanted;
      entry->wanted.reset();
      entry->downloading = true;
      StartDownloadLocked(wanted, &free);
    }
  }
}

void ShardCache::EvictLocked(int64_t* free_bytes) {
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
  if (options_.min_free_bytes <= 0 || *free_bytes < 0) return;
  int64_t& free = *free_bytes;
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
  if (options_.min_free_bytes <= 0) return -1;
  if (options_.free_bytes) return options_.free_bytes(options_.dir);
  struct statvfs st;
  if (statvfs(options_.dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

std::shared_ptr<ShardCache::Entry> ShardCache::AdoptLocked(
    const CacheDirectory::Record& record) {
  auto entry = std::make_shared<Entry>();
  entry->url = record.url;
  entry->size = record.size;
  entry->sha256 = record.sha256;
  entry->ready = true;
  entry->lru = lru_.insert(lru_.end(), record.url);
  entries_[record.url] = entry;
  bytes_ += entry->size;
  UpdateGaugeLocked();
  return entry;
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
  // The shard's entry on disk, looked up without the lock when the cache
  // does not know the shard (unset = not looked up yet).
  std::optional<std::optional<CacheDirectory::Record>> on_disk;
  for (;;) {
    absl::Status refused;
    bool look_on_disk = false;
    std::shared_ptr<Entry> hit;  // ready and pinned: its file is mapped next
    CacheDirectory::Record hit_record;
    int64_t free = FreeBytes();  // for eviction, read without the lock
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(shard.url);
      std::shared_ptr<Entry> entry =
          it == entries_.end() ? nullptr : it->second;
      if (shut_down_) {
        refused = absl::UnavailableError("data server is shutting down");
      } else if (entry != nullptr && entry->ready &&
                 ((shard.size_bytes > 0 && entry->size != shard.size_bytes) ||
                  (!expected_sha->empty() && entry->sha256 != *expected_sha))) {
        // The manifest describes another version than the cached one: its
        // files go, and this Open waits for the new version below.
        DropLocked(entry, /*remove_files=*/true);
      } else if (entry == nullptr && !on_disk.has_value()) {
        look_on_disk = true;
      } else if (entry == nullptr && on_disk->has_value()) {
        entry = AdoptLocked(**on_disk);
      }
      if (refused.ok() && !look_on_disk) {
        if (entry != nullptr && entry->ready) {
          ++entry->pins;  // not evicted while its file is mapped
          lru_.splice(lru_.end(), lru_, entry->lru);
          hit = entry;
          hit_record = {entry->url, entry->size, entry->sha256};
        } else {
          if (options_.metrics != nullptr)
            options_.metrics->cache_misses.Increment();
          if (entry == nullptr) {
            entry = std::make_shared<Entry>();
            entry->url = shard.url;
            entry->downloading = true;
            entries_[shard.url] = entry;
            entry->waiters.push_back(std::exchange(done, nullptr));
            StartDownloadLocked(shard, &free);
          } else {
            entry->waiters.push_back(std::exchange(done, nullptr));
            if (entry->removing && !entry->wanted.has_value())
              entry->wanted = shard;
          }
        }
      }
    }
    RemoveDoomed();
    if (!refused.ok()) {
      done(refused);
      return;
    }
    if (look_on_disk) {
      on_disk = directory_.Find(shard, *expected_sha);
      continue;
    }
    if (hit == nullptr) return;  // `done` waits for a download
    absl::StatusOr<std::shared_ptr<const ShardData>> data =
        directory_.Map(hit_record);
    if (data.ok()) {
      if (options_.metrics != nullptr) options_.metrics->cache_hits.Increment();
      done(Pinned(hit, *std::move(data)));
      return;
    }
    // Evicted underneath us by a process sharing the directory: download
    // it again.
    {
      absl::MutexLock lock(&mu_);
      --hit->pins;
      DropLocked(hit, /*remove_files=*/false);
    }
    on_disk = std::optional<CacheDirectory::Record>();
  }
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
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_ || entries_.count(shard.url) > 0) return;
  }
  const std::optional<CacheDirectory::Record> on_disk =
      directory_.Find(shard, *expected_sha);
  int64_t free = FreeBytes();
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_ || entries_.count(shard.url) > 0) return;
    if (on_disk.has_value()) {
      AdoptLocked(*on_disk);
      return;
    }
    if (queued_prefetches_ >= options_.max_queued_prefetches) return;
    auto entry = std::make_shared<Entry>();
    entry->url = shard.url;
    entry->downloading = true;
    entry->prefetch = true;
    ++queued_prefetches_;
    entries_[shard.url] = entry;
    StartDownloadLocked(shard, &free);
  }
  RemoveDoomed();
}

void ShardCache::StartDownloadLocked(const ShardRef& shard,
                                     int64_t* free_bytes) {
  reserved_ += std::max<int64_t>(0, shard.size_bytes);
  EvictLocked(free_bytes);
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
  int64_t free = FreeBytes();
  {
    absl::MutexLock lock(&mu_);
    reserved_ -= std::max<int64_t>(0, shard.size_bytes);
    std::shared_ptr<Entry> entry = entries_[shard.url];
    if (entry->prefetch) --queued_prefetches_;
    entry->prefetch = false;
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
      entry->pins += static_cast<int>(waiters.size());
      for (size_t i = 0; i < waiters.size(); ++i)
        results.push_back(Pinned(entry, *data));
      data = absl::CancelledError(
          "");  // drop the unpinned mapping before eviction
      EvictLocked(&free);
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
  RemoveDoomed();
  for (size_t i = 0; i < waiters.size(); ++i) waiters[i](std::move(results[i]));
}

absl::StatusOr<std::shared_ptr<const ShardData>> ShardCache::DownloadToCache(
    const ShardRef& shard, FetchFailure* failure, std::string* sha256) {
  int64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = ++temp_counter_;
  }
  return directory_.Install(
      shard, n,
      [this, &shard](int fd, bool hash, FetchFailure* f) {
        return fetcher_->Fetch(shard.url, fd, hash, f);
      },
      failure, sha256);
}

}  // namespace sluice::dataserver
