// The shard cache: remote shards downloaded once into a local directory and
// served from there, without lock files.
//
// The directory itself (layout, records, crash-safe install, start-up
// adoption) is CacheDirectory (cache_directory.h); this class keeps the
// in-memory side: single flight, pins, LRU and eviction, prefetches.
//
// How it stays correct without locks:
//  * Single flight in memory: concurrent requests for one URL in this process
//    wait on one download (one GET).
//  * A download goes to a temp file unique to (host, pid, counter), is checked
//    (size against Content-Length and the manifest's size_bytes, SHA-256
//    against the manifest's checksum), fsync'd, and renamed into place:
//    .meta first, then .shard, then the directory is fsync'd. Readers open
//    only final names, so nobody ever reads a partial file, in this process
//    or in another one sharing the directory.
//  * Readers hold the shard mapped (mmap); a file evicted or replaced while
//    mapped stays readable until unmapped (unlink/rename never truncate).
//  * Eviction is LRU over whole shards and never touches a shard that a live
//    stream in this process has open (pinned).
//  * No file I/O under the cache's lock: files are looked up, mapped and
//    removed, and the filesystem's free space read, outside it. An evicted
//    entry stays in the table, "removing", until its files are gone, so nobody
//    adopts them meanwhile; an Open that arrives then waits and downloads the
//    shard afresh.
//  * Start-up removes temp files left by dead processes of this host (the pid
//    in the name is not running) or older than a day, removes entries whose
//    .shard and .meta disagree (size, name), and adopts the rest, oldest
//    first in LRU order.
//
// One data server per node owns its cache directory: it holds an flock on
// `<dir>/LOCK` for its life (DirLock; the kernel drops it when the process
// dies), and a second one is refused. Sharing one directory between several
// processes is allowed on request (ShardCacheOptions::shared_dir,
// --shared_cache_dir): it stays correct (no partial reads, no lock files)
// but each keeps its own byte accounting, so together they may exceed
// --cache_bytes.
#ifndef SLUICE_SERVER_DATASERVER_SHARD_CACHE_H_
#define SLUICE_SERVER_DATASERVER_SHARD_CACHE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/common/dir_lock.h"
#include "server/common/thread_pool.h"
#include "server/dataserver/cache_directory.h"
#include "server/dataserver/dataserver_metrics.h"
#include "server/dataserver/remote_fetcher.h"
#include "server/format/shard_store.h"

namespace sluice::dataserver {

struct ShardCacheOptions {
  std::string dir;
  // Bytes of complete shards kept; 0 = unbounded.
  int64_t max_bytes = 0;
  // Unpinned shards are also evicted while the filesystem has less than
  // this free (plus room for the downloads in flight): --cache_bytes larger
  // than the disk does not end in ENOSPC. 0 = no check.
  int64_t min_free_bytes = 0;
  // Free bytes of the filesystem holding `dir`; null = statvfs. Tests fake it.
  std::function<int64_t(const std::string& dir)> free_bytes;
  // Downloads running at once.
  int download_threads = 4;
  // Shards fetched ahead on a prefetch hint at most at once (queued ones
  // beyond this are dropped: hints are advisory).
  int max_queued_prefetches = 64;
  DataServerMetrics* metrics = nullptr;  // may be null
  // Tests: runs before an evicted shard's files are removed (without the
  // cache's lock).
  std::function<void(const std::string& url)> before_remove_for_testing;
  // False: the directory is this process's alone (DirLock on `dir`; a
  // second process is refused, naming the holder's PID). True: other
  // processes may use it at once (correct, but each counts only its own
  // bytes against max_bytes).
  bool shared_dir = false;
};

class ShardCache : public std::enable_shared_from_this<ShardCache> {
 public:
  using OpenCallback = ShardStore::OpenCallback;

  // Creates the directory if needed, cleans it up and adopts what is there.
  static absl::StatusOr<std::shared_ptr<ShardCache>> Create(
      ShardCacheOptions options, std::unique_ptr<RemoteFetcher> fetcher);
  ~ShardCache();

  // The shard, downloaded first if it is not cached. The result is pinned
  // (not evicted) while any copy of the pointer lives. `done` runs inline on
  // a hit and on a download thread otherwise.
  void OpenAsync(const ShardRef& shard, OpenCallback done);
  absl::StatusOr<std::shared_ptr<const ShardData>> Open(const ShardRef& shard);
  // Starts downloading `shard` unless it is cached or being downloaded.
  void Prefetch(const ShardRef& shard);

  // Stops downloads in progress (they fail with CANCELLED) and refuses new
  // ones. Called on shutdown; the destructor waits for the threads.
  void Shutdown();

  int64_t bytes_in_use() const;
  std::vector<std::string> CachedUrls() const;
  // "<dir>/<sha256(url)>.shard": where `url` is cached.
  std::string PathFor(const std::string& url) const;

 private:
  struct Entry {
    std::string url;
    int64_t size = 0;
    std::string sha256;
    bool ready = false;        // the final file exists and is verified
    bool downloading = false;  // a download is in flight
    bool prefetch = false;     // started by a prefetch hint
    bool removing = false;     // evicted; its files are being removed
    int pins = 0;              // live pointers handed out
    std::vector<OpenCallback> waiters;
    // What to download once a removing entry's files are gone, when Opens
    // arrived meanwhile.
    std::optional<ShardRef> wanted;
    std::list<std::string>::iterator lru;  // valid when ready
  };

  ShardCache(ShardCacheOptions options, std::unique_ptr<RemoteFetcher> fetcher);
  absl::Status Scan();
  // `free_bytes`: as for EvictLocked.
  void StartDownloadLocked(const ShardRef& shard, int64_t* free_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Download(const ShardRef& shard);
  // Downloads, verifies and installs `shard`; `sha256` gets its hex digest
  // when the manifest has a checksum (empty otherwise).
  absl::StatusOr<std::shared_ptr<const ShardData>> DownloadToCache(
      const ShardRef& shard, FetchFailure* failure, std::string* sha256);
  // `data` handed out under a pin the caller took (++pins under mu_): the
  // pin is released when the last copy of the result goes.
  std::shared_ptr<const ShardData> Pinned(
      const std::shared_ptr<Entry>& entry,
      std::shared_ptr<const ShardData> data);
  void Unpin(const std::shared_ptr<Entry>& entry);
  // Adopts a complete entry another process (or an earlier run) left in the
  // directory, found by CacheDirectory::Find.
  std::shared_ptr<Entry> AdoptLocked(const CacheDirectory::Record& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the files of the entries DropLocked doomed, without the lock,
  // then forgets them or downloads them for the Opens that arrived meanwhile.
  // Called after every operation that may evict, once mu_ is released.
  void RemoveDoomed() ABSL_LOCKS_EXCLUDED(mu_);
  // Evicts unpinned shards, least recently used first, until the ready bytes
  // plus the known sizes of downloads in flight fit --cache_bytes, and the
  // filesystem keeps min_free_bytes free besides the downloads in flight.
  // `free_bytes`: the filesystem's free bytes, read by FreeBytes() before
  // the lock was taken (-1 = not known); raised by what this evicts.
  void EvictLocked(int64_t* free_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the entry; with remove_files it stays, removing, until
  // RemoveDoomed has deleted its files.
  void DropLocked(const std::shared_ptr<Entry>& entry, bool remove_files)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // statvfs (or options.free_bytes); -1 without min_free_bytes or on error.
  // Never called under mu_.
  int64_t FreeBytes() const;

  const ShardCacheOptions options_;
  std::optional<DirLock> dir_lock_;  // unless options_.shared_dir
  const CacheDirectory directory_;
  const std::unique_ptr<RemoteFetcher> fetcher_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  // Ready entries, least recently used first.
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;     // ready entries
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;  // known sizes in flight
  int64_t temp_counter_ ABSL_GUARDED_BY(mu_) = 0;
  // Entries whose files RemoveDoomed deletes next.
  std::vector<std::shared_ptr<Entry>> doomed_ ABSL_GUARDED_BY(mu_);
  int queued_prefetches_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool warned_full_ ABSL_GUARDED_BY(mu_) = false;

  // Last member: destroyed (joined) first.
  std::unique_ptr<ThreadPool> downloads_;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_SHARD_CACHE_H_
