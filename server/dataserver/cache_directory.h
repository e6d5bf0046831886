// The shard cache's directory on disk: its layout, the record beside each
// shard, crash-safe installation and what start-up adopts. No lock, no
// accounting: ShardCache (shard_cache.h) decides what to keep.
//
// Layout (flat):
//   <h>.shard   a complete, verified shard (h = SHA-256 of its URL, hex)
//   <h>.meta    "sluice-cache-v1\n<url>\n<size>\n<sha256 hex or empty>\n"
//               (the body is hashed only when the manifest has a checksum)
//   .tmp-<pid>-<n>-<shard|meta>-<h>@<host>   a download in progress
//
// A download goes to a temp file unique to (host, pid, n), is checked,
// fsync'd and renamed into place: .meta first, then .shard, then the
// directory is fsync'd, so a final name always holds a complete file with
// its record, in this process or in another one sharing the directory.
//
// Thread-safe (it holds no state besides its path).
#ifndef SLUICE_SERVER_DATASERVER_CACHE_DIRECTORY_H_
#define SLUICE_SERVER_DATASERVER_CACHE_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/dataserver/remote_fetcher.h"
#include "server/format/shard_store.h"

namespace sluice::dataserver {

// "sha256:<hex>" -> "<hex>" (lowercased); empty for an empty checksum;
// INVALID_ARGUMENT naming the shard for anything else.
absl::StatusOr<std::string> ExpectedSha256(const ShardRef& shard);

class CacheDirectory {
 public:
  explicit CacheDirectory(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  // "<dir>/<sha256(url)>.shard": where `url` is cached.
  std::string ShardPath(const std::string& url) const;

  // A complete entry's record.
  struct Record {
    std::string url;
    int64_t size = 0;
    std::string sha256;  // empty when the body was not hashed
  };
  struct ScanResult {
    std::vector<Record> complete;  // oldest (by the shard's mtime) first
    int removed = 0;               // leftover files deleted
  };
  // Start-up: removes temp files left by dead processes of this host (the
  // pid in the name is not running) or older than a day, and entries whose
  // .shard and .meta disagree (size, name) unless one may be mid-install
  // (a minute); returns the complete entries.
  absl::StatusOr<ScanResult> Scan() const;

  // The complete entry of `shard` (left by another process or an earlier
  // run), if its record matches the shard's URL, size_bytes and checksum.
  std::optional<Record> Find(const ShardRef& shard,
                             const std::string& expected_sha) const;

  // Maps an entry's file; NOT_FOUND when it vanished or changed size (evicted
  // or replaced by another process sharing the directory).
  absl::StatusOr<std::shared_ptr<const ShardData>> Map(
      const Record& record) const;

  // Deletes an entry's files: .shard first, so a crash in between leaves a
  // .meta alone, which Scan removes.
  void Remove(const std::string& url) const;

  // Writes the body of a download into `fd` (a new temp file); `sha256`:
  // hash it on the way.
  using Fetch = std::function<absl::StatusOr<FetchResult>(
      int fd, bool sha256, FetchFailure* failure)>;
  // Downloads `shard` with `fetch` into temp files numbered `n` (unique in
  // this process), checks its size against the manifest's size_bytes and
  // its SHA-256 against the checksum, and installs it; `failure` says why
  // it failed, `sha256` gets the digest when there was a checksum.
  absl::StatusOr<std::shared_ptr<const ShardData>> Install(
      const ShardRef& shard, int64_t n, const Fetch& fetch,
      FetchFailure* failure, std::string* sha256) const;

 private:
  const std::string dir_;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_CACHE_DIRECTORY_H_
