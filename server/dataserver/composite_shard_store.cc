#include "server/dataserver/composite_shard_store.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/dataserver/remote_fetcher.h"

namespace sluice::dataserver {

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
