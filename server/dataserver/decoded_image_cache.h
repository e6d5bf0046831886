// DecodedImageCache: decoded images shared between the jobs that read the
// same shard on one data server at the same time (a sweep of trials over one
// dataset), so that each image is decoded about once for all of them.
//
// An entry is a whole image decoded at one DCT scale (a JPEG's window
// decode equals the same window cropped from a whole decode at that scale,
// bit for bit, so every job crops and transforms its own view of the entry
// and gets the tensor it would get alone). Keys name the image (shard URL
// and version, sample index, field, encoded size) and the scale.
// The cache holds at most `capacity_bytes` of pixels and evicts the least
// recently used entries. A decode in flight is shared too: a caller asking
// for an image another caller is decoding waits for that one decode (one
// image's decode time, never more) instead of decoding it again.
//
// It is used only while it can help: for a sample of a shard that another
// job also has a stream open on (StreamOpened / StreamClosed keep count),
// and for every sample of a lease whose shards the coordinator says another
// job reads too (Lease.shared_shards: trials of a sweep, from their first
// samples, before they read any shard at the same time). A job reading
// alone decodes only the windows it needs, as without the cache.
// Thread-safe.
#ifndef SLUICE_SERVER_DATASERVER_DECODED_IMAGE_CACHE_H_
#define SLUICE_SERVER_DATASERVER_DECODED_IMAGE_CACHE_H_

#include <cstdint>
#include <list>
#include <map>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/dataserver/image_types.h"
#include "server/format/shard_store.h"

namespace sluice::dataserver {

class DecodedImageCache {
 public:
  explicit DecodedImageCache(int64_t capacity_bytes)
      : capacity_bytes_(capacity_bytes) {}
  DecodedImageCache(const DecodedImageCache&) = delete;
  DecodedImageCache& operator=(const DecodedImageCache&) = delete;

  // The key of one image: a field of a sample of `shard` (read as `url`),
  // with the shard's version (ShardData::version(): a file rewritten under
  // the same URL gets other keys) and the size of the field's encoded bytes
  // (`encoded`), and for an in-memory shard a hash of them.
  static std::string ImageKey(absl::string_view url, const ShardData& shard,
                              int64_t index, absl::string_view field,
                              absl::string_view encoded);

  // A stream of `job` reads shard `url` from now on / no longer.
  void StreamOpened(const std::string& url, const std::string& job);
  void StreamClosed(const std::string& url, const std::string& job);
  // Whether a job other than `job` has a stream open on `url`.
  bool SharedWithOtherJob(const std::string& url, const std::string& job) const;

  // The image `key` decoded at `scale_eighths` / 8: from the cache, or from
  // a decode in flight, or from `decode()` (whose result is kept; an error
  // is returned and not kept). `*hit` (optional): whether it was not decoded
  // by this call.
  absl::StatusOr<ImageBuffer> GetOrDecode(
      const std::string& key, int scale_eighths,
      absl::FunctionRef<absl::StatusOr<ImageBuffer>()> decode,
      bool* hit = nullptr);

  struct Stats {
    int64_t hits = 0;     // served without a decode by the caller
    int64_t misses = 0;   // decoded by the caller
    int64_t waits = 0;    // hits that waited for a decode in flight
    int64_t waiting = 0;  // callers waiting for one now
    int64_t evictions = 0;
    int64_t entries = 0;
    int64_t bytes = 0;
  };
  Stats stats() const;
  int64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  struct Entry {
    bool ready = false;  // false: being decoded by one caller
    ImageBuffer image;
    int64_t bytes = 0;
    std::list<std::string>::iterator lru;  // valid once ready
  };
  static int64_t BytesOf(const ImageBuffer& image);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Per shard URL, the jobs with streams open on it and how many each.
  std::map<std::string, std::map<std::string, int>> readers_
      ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_DECODED_IMAGE_CACHE_H_
