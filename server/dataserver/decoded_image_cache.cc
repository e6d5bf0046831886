#include "server/dataserver/decoded_image_cache.h"

#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace sluice::dataserver {

std::string DecodedImageCache::ImageKey(absl::string_view url,
                                        const ShardData& shard, int64_t index,
                                        absl::string_view field,
                                        absl::string_view encoded) {
  // A NUL cannot occur in a URL, a version or a field name.
  const absl::string_view nul("\0", 1);
  std::string key = absl::StrCat(url, nul, shard.version(), nul, index, nul,
                                 field, nul, encoded.size());
  if (shard.in_memory()) {
    absl::StrAppend(&key, ":", absl::Hash<absl::string_view>{}(encoded));
  }
  return key;
}

void DecodedImageCache::StreamOpened(const std::string& url,
                                     const std::string& job) {
  absl::MutexLock lock(&mu_);
  ++readers_[url][job];
}

void DecodedImageCache::StreamClosed(const std::string& url,
                                     const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto shard = readers_.find(url);
  if (shard == readers_.end()) return;
  auto it = shard->second.find(job);
  if (it != shard->second.end() && --it->second <= 0) shard->second.erase(it);
  if (shard->second.empty()) readers_.erase(shard);
}

bool DecodedImageCache::SharedWithOtherJob(const std::string& url,
                                           const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto shard = readers_.find(url);
  if (shard == readers_.end()) return false;
  for (const auto& [other, streams] : shard->second) {
    if (other != job && streams > 0) return true;
  }
  return false;
}

int64_t DecodedImageCache::BytesOf(const ImageBuffer& image) {
  return static_cast<int64_t>(image.stride) * image.height;
}

absl::StatusOr<ImageBuffer> DecodedImageCache::GetOrDecode(
    const std::string& key, int scale_eighths,
    absl::FunctionRef<absl::StatusOr<ImageBuffer>()> decode, bool* hit) {
  const std::string scaled = absl::StrCat(key, "@", scale_eighths);
  {
    absl::MutexLock lock(&mu_);
    bool waited = false;
    while (true) {
      auto it = entries_.find(scaled);
      if (it == entries_.end()) {
        entries_.emplace(scaled, Entry{});  // this call decodes it
        ++stats_.misses;
        break;
      }
      if (it->second.ready) {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        ++stats_.hits;
        if (waited) ++stats_.waits;
        if (hit != nullptr) *hit = true;
        return it->second.image;
      }
      // Another call is decoding it: wait for that decode (or its failure,
      // after which this call decodes).
      struct Settled {
        const DecodedImageCache* cache;
        const std::string* key;
        bool Done() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
          auto e = cache->entries_.find(*key);
          return e == cache->entries_.end() || e->second.ready;
        }
      };
      const Settled settled{this, &scaled};
      ++stats_.waiting;
      mu_.Await(absl::Condition(&settled, &Settled::Done));
      --stats_.waiting;
      waited = true;
    }
  }
  if (hit != nullptr) *hit = false;
  absl::StatusOr<ImageBuffer> image = decode();
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(scaled);
  const int64_t bytes = image.ok() ? BytesOf(*image) : 0;
  if (!image.ok() || bytes > capacity_bytes_) {
    entries_.erase(it);  // waiters decode it themselves
    return image;
  }
  it->second.ready = true;
  it->second.image = *image;
  it->second.bytes = bytes;
  lru_.push_front(scaled);
  it->second.lru = lru_.begin();
  bytes_ += bytes;
  EvictLocked();
  return image;
}

void DecodedImageCache::EvictLocked() {
  while (bytes_ > capacity_bytes_ && !lru_.empty()) {
    auto it = entries_.find(lru_.back());
    lru_.pop_back();
    bytes_ -= it->second.bytes;
    entries_.erase(it);
    ++stats_.evictions;
  }
}

DecodedImageCache::Stats DecodedImageCache::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.entries = static_cast<int64_t>(lru_.size());
  s.bytes = bytes_;
  return s;
}

}  // namespace sluice::dataserver
