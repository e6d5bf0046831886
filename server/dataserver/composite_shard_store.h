// The data server's ShardStore: local paths go to a LocalShardStore under
// --roots, http(s)/s3 URLs to the shard cache (shard_cache.h) under
// --cache_dir. A URL whose side is not configured is FAILED_PRECONDITION
// naming the flag that enables it.
#ifndef SLUICE_SERVER_DATASERVER_COMPOSITE_SHARD_STORE_H_
#define SLUICE_SERVER_DATASERVER_COMPOSITE_SHARD_STORE_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/dataserver/shard_cache.h"
#include "server/format/shard_store.h"

namespace sluice::dataserver {

// Routes local paths to a LocalShardStore and http(s)/s3 URLs to the cache.
class CompositeShardStore : public ShardStore {
 public:
  // Either may be null (then those URLs get FAILED_PRECONDITION naming the
  // flag that enables them).
  CompositeShardStore(std::unique_ptr<LocalShardStore> local,
                      std::shared_ptr<ShardCache> cache)
      : local_(std::move(local)), cache_(std::move(cache)) {}
  ~CompositeShardStore() override;

  using ShardStore::Open;
  absl::StatusOr<std::shared_ptr<const ShardData>> Open(
      const ShardRef& shard) override;
  bool IsRemote(absl::string_view url) const override;
  void OpenAsync(const ShardRef& shard, OpenCallback done) override;

 private:
  absl::Status Unavailable(absl::string_view url) const;
  std::unique_ptr<LocalShardStore> local_;
  std::shared_ptr<ShardCache> cache_;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_COMPOSITE_SHARD_STORE_H_
