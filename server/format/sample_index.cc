#include "server/format/sample_index.h"

namespace sluice::dataserver {

std::shared_ptr<const ShardIndex> SampleIndexCache::Find(
    const std::string& version) {
  absl::MutexLock lock(&mu_);
  auto it = by_version_.find(version);
  if (it == by_version_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void SampleIndexCache::Insert(const std::string& version,
                              std::shared_ptr<const ShardIndex> index) {
  absl::MutexLock lock(&mu_);
  auto it = by_version_.find(version);
  if (it != by_version_.end()) {
    it->second->second = std::move(index);
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(version, std::move(index));
  by_version_[version] = lru_.begin();
  while (lru_.size() > max_entries_ && !lru_.empty()) {
    by_version_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

size_t SampleIndexCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

}  // namespace sluice::dataserver
