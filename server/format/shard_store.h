// Where shard bytes come from. A ShardStore turns a shard URL into a
// read-only, memory-mapped view of the whole shard; the tar reader and the
// sample encoder hand out views into it, so a served payload is never copied
// in user space (the mapping lives as long as any view's owner holds it).
//
// LocalShardStore serves local and network-mounted paths ("/data/x.tar",
// "file:///data/x.tar") restricted to a set of root directories. Remote
// stores (http(s), s3) and the shard cache implement the same interface.
//
// Shards are immutable by contract (WebDataset shards are written once;
// replace a file by rename, as the cache does). A file truncated or
// rewritten in place while it is mapped is detected, not crashed on: a read
// of a page the file no longer has (SIGBUS) is answered with zeros and the
// shard marked damaged, and CheckIntact() compares the file with what was
// mapped, so the stream reading it ends with DATA_LOSS instead of the
// process dying.
#ifndef SLUICE_SERVER_FORMAT_SHARD_STORE_H_
#define SLUICE_SERVER_FORMAT_SHARD_STORE_H_

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/common/path_roots.h"

namespace sluice::dataserver {

// A whole shard mapped read-only. Thread-safe (immutable).
class ShardData {
 public:
  // Maps `fd` (which it closes); `path` is for messages only.
  static absl::StatusOr<std::shared_ptr<const ShardData>> Map(int fd,
                                                              std::string path);
  // For tests and small in-memory shards.
  static std::shared_ptr<const ShardData> FromString(std::string bytes,
                                                     std::string path);
  ~ShardData();
  ShardData(const ShardData&) = delete;
  ShardData& operator=(const ShardData&) = delete;

  absl::string_view bytes() const { return {data_, size_}; }
  // OK while the file is what was mapped. DATA_LOSS naming the shard once
  // it was truncated (a read found pages gone) or its size or modification
  // time changed. One fstat; always OK for in-memory shards.
  absl::Status CheckIntact() const;
  int64_t size() const { return static_cast<int64_t>(size_); }
  // Resolved path (or URL) for messages and index-cache keys.
  const std::string& path() const { return path_; }
  // Changes when the file behind the path changes (size + mtime + inode),
  // so a cached index of an older version is not reused.
  const std::string& version() const { return version_; }
  // An in-memory shard (FromString): its version names only its size.
  bool in_memory() const { return !owned_.empty(); }

 private:
  ShardData() = default;
  const char* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  int fd_ = -1;  // kept open for CheckIntact
  struct timespec mtime_ = {};
  // Set by the SIGBUS handler (shard_store.cc) when a read of the mapping
  // found the file shorter than mapped.
  mutable std::atomic<bool> faulted_{false};
  int fault_slot_ = -1;
  std::string owned_;
  std::string path_;
  std::string version_;
};

// A shard as a lease names it: the URL plus what the manifest says about it
// (a remote store checks downloads against these).
struct ShardRef {
  std::string url;
  int64_t size_bytes = 0;  // 0 = unknown
  std::string checksum;    // "sha256:<hex>" or empty
};

class ShardStore {
 public:
  using OpenCallback =
      std::function<void(absl::StatusOr<std::shared_ptr<const ShardData>>)>;

  virtual ~ShardStore() = default;
  // NOT_FOUND for a missing shard, PERMISSION_DENIED for a location the
  // store may not serve (checked before anything is opened),
  // INVALID_ARGUMENT for a URL it cannot parse. May block (a remote store
  // downloads first).
  virtual absl::StatusOr<std::shared_ptr<const ShardData>> Open(
      const ShardRef& shard) = 0;
  absl::StatusOr<std::shared_ptr<const ShardData>> Open(absl::string_view url) {
    return Open(ShardRef{std::string(url), 0, ""});
  }
  // True when opening `url` may wait on the network: callers then use
  // OpenAsync instead of blocking a thread.
  virtual bool IsRemote(absl::string_view /*url*/) const { return false; }
  // Calls `done` once, inline or from a store thread.
  virtual void OpenAsync(const ShardRef& shard, OpenCallback done) {
    done(Open(shard));
  }
};

class LocalShardStore : public ShardStore {
 public:
  // `roots` are directories; each must exist. Their real paths (symlinks
  // resolved) bound every shard served.
  static absl::StatusOr<std::unique_ptr<LocalShardStore>> Create(
      const std::vector<std::string>& roots);

  using ShardStore::Open;
  absl::StatusOr<std::shared_ptr<const ShardData>> Open(
      const ShardRef& shard) override;

  // The absolute path `url` names, lexically normalised and checked against
  // the roots, then with symlinks resolved and checked again. Exposed for
  // tests.
  absl::StatusOr<std::string> Resolve(absl::string_view url) const;

  const std::vector<std::string>& roots() const { return roots_.roots(); }

  // Recently opened shards are kept (at most this many) and reused while
  // their URL still names the same file (device, inode, size and mtime, one
  // stat): a shuffle window's units open the same shards again and again.
  static constexpr size_t kRecentShards = 128;

 private:
  explicit LocalShardStore(PathRoots roots) : roots_(std::move(roots)) {}
  PathRoots roots_;
  absl::Mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const ShardData>>> recent_
      ABSL_GUARDED_BY(mu_);  // most recent first
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_FORMAT_SHARD_STORE_H_
