// The per-shard sample index and its bounded cache.
//
// A shard is scanned once (headers only) into a ShardIndex: for every sample
// its key, the offset of its first tar header and its size. Reading samples
// [k, end) of an uncompressed shard then starts libarchive at samples[k]
// .offset instead of at byte 0. Compressed shards cannot be entered in the
// middle; for them the offsets are informational and reads skip forward.
#ifndef SLUICE_SERVER_FORMAT_SAMPLE_INDEX_H_
#define SLUICE_SERVER_FORMAT_SAMPLE_INDEX_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace sluice::dataserver {

// Why a sample cannot be served (the data server counts samples by it).
enum class SampleDamage {
  kNone,
  kDamagedTar,      // a member unreadable, truncated or too large to hold
  kDuplicateField,  // two members of one sample with the same extension
  kLost,            // after a break in a compressed shard: not reachable
};

struct IndexedSample {
  std::string key;
  // Offset of the sample's first header (its pax/long-name header if any) in
  // the uncompressed tar stream.
  int64_t offset = 0;
  // Bytes of member data.
  int64_t bytes = 0;
  // Non-empty when the sample cannot be served (a damaged member, a
  // duplicate field); says why, naming the member. `damage` is its kind.
  std::string corrupt;
  SampleDamage damage = SampleDamage::kNone;
};

struct ShardIndex {
  std::vector<IndexedSample> samples;
  // True for plain (uncompressed) tars: offsets are file offsets.
  bool seekable = false;
  // Non-empty when the scan stopped at damage before the end of the archive:
  // samples past the last one listed are lost. Names the shard and member.
  std::string damage;
  int64_t size_bytes = 0;

  int64_t num_samples() const { return static_cast<int64_t>(samples.size()); }
};

// LRU of shard indexes keyed by shard version (path + size + mtime + inode),
// bounded by entry count. Thread-safe.
class SampleIndexCache {
 public:
  explicit SampleIndexCache(size_t max_entries) : max_entries_(max_entries) {}

  std::shared_ptr<const ShardIndex> Find(const std::string& version);
  void Insert(const std::string& version,
              std::shared_ptr<const ShardIndex> index);
  size_t size() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const ShardIndex>>;
  const size_t max_entries_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // front = most recent
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> by_version_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_FORMAT_SAMPLE_INDEX_H_
