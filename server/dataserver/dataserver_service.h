// The data server's logic, free of gRPC types: checks a ReadRequest (lease
// token, range, decode spec) and hands out a SampleStream (sample_stream.h),
// a pull-based producer of encoded SampleBatch messages that the gRPC
// adapter pumps; indexes shards; tracks fences. Thread-safe.
#ifndef SLUICE_SERVER_DATASERVER_DATASERVER_SERVICE_H_
#define SLUICE_SERVER_DATASERVER_DATASERVER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/dataserver/dataserver_metrics.h"
#include "server/dataserver/decode_budget.h"
#include "server/dataserver/decoded_image_cache.h"
#include "server/dataserver/decoders.h"
#include "server/dataserver/fair_pool.h"
#include "server/dataserver/fence_tracker.h"
#include "server/dataserver/image_transforms.h"
#include "server/dataserver/sample_encoder.h"
#include "server/dataserver/sample_stream.h"
#include "server/format/sample_index.h"
#include "server/format/shard_store.h"
#include "server/format/tar_shard_reader.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice::dataserver {

struct DataServerOptions {
  std::unique_ptr<ShardStore> store;
  // The node this server runs on (RegisterDataServer.node); with the
  // readers' (ReadRequest.node), the bytes served are counted by locality.
  std::string node;
  // Lease-token secret shared with the coordinator; empty = tokens are not
  // checked (only lease.unit is used).
  std::string lease_secret;
  size_t index_cache_entries = 4096;
  int decode_threads = 0;  // 0 = one per core
  int64_t default_batch_bytes = 1 << 20;
  // Requests asking for bigger messages are clamped to this.
  int64_t max_batch_bytes = 16 << 20;
  size_t prefetch_messages = 2;
  // Images whose header claims more pixels are corrupt samples (see
  // ImageOptions::max_pixels); 0 = no limit.
  int64_t max_image_pixels = kDefaultMaxImagePixels;
  // A lease token past its signed expiry by more than this is refused
  // (ABORTED): the coordinator's and this server's clocks may differ by
  // this much.
  absl::Duration lease_clock_skew = absl::Seconds(30);
  // A member of a compressed shard larger than this is a corrupt sample
  // instead of a buffer held per reader (uncompressed members are served
  // from the mapping and need no cap).
  int64_t max_sample_bytes = kDefaultMaxSampleBytes;
  // Estimated memory of the samples being decoded, across all streams
  // (decode_budget.h); <= 0 = no bound.
  int64_t max_decode_memory = int64_t{1} << 30;
  // Streams open at once per tenant (Lease.tenant); a ReadSamples beyond it
  // is RESOURCE_EXHAUSTED naming the tenant and the limit. 0 = no limit.
  int32_t max_streams_per_tenant = 0;
  // Decoded images kept for jobs that read the same shard at the same time
  // (decoded_image_cache.h), in bytes of pixels; 0 = every job decodes its
  // own.
  int64_t shared_decode_bytes = int64_t{256} << 20;
  DataServerMetrics* metrics = nullptr;  // may be null
  // Tests: called on the decoding thread before a sample's fields are
  // decoded (with the sample's index in its shard).
  std::function<void(int64_t index)> before_decode_for_testing;
};

class DataServerService {
 public:
  static absl::StatusOr<std::unique_ptr<DataServerService>> Create(
      DataServerOptions options);

  // Checks the request (token, fence, range shape, decode spec) before any
  // I/O, resolves the shard, and returns its stream. Range errors that need
  // the index (OUT_OF_RANGE) come from the stream's first Next().
  absl::StatusOr<std::shared_ptr<SampleStream>> ReadSamples(
      const v1::ReadRequest& request);
  // The one sample of a replay lease, served as ReadSamples serves it (the
  // token and expiry checked, not the fence), with the geometry its image
  // transforms drew; `done` runs on a pool thread or inline for an early
  // error. INVALID_ARGUMENT naming the lease unless
  // it covers exactly one sample of one shard.
  void ReplaySample(
      const v1::ReadRequest& request,
      std::function<void(absl::StatusOr<v1::ReplayedSample>)> done);
  // The draws of each replay lease's sample under request.decode, from
  // its image's header (no decode); `done` as for ReplaySample.
  void ReplayDraws(
      const v1::ReplayDrawsRequest& request,
      std::function<void(absl::StatusOr<v1::ReplayDrawsResponse>)> done);
  absl::StatusOr<v1::ShardIndex> IndexShard(
      const v1::IndexShardRequest& request);
  // The same without blocking a thread on a download (IndexShard waits on
  // it): `done` runs on a pool thread (or inline for an early error).
  void IndexShardAsync(
      const v1::IndexShardRequest& request,
      std::function<void(absl::StatusOr<v1::ShardIndex>)> done);

  // The shard's index, from the cache or by scanning it.
  std::shared_ptr<const ShardIndex> GetIndex(
      const std::shared_ptr<const ShardData>& shard);

  // New streams are refused from now on, with HandedBackStatus.
  void Drain();
  // Open streams end at their next batch from now on, with
  // HandedBackStatus: the rest of their leases goes back to the coordinator.
  void HandBack();
  bool handing_back() const {
    return handing_back_.load(std::memory_order_relaxed);
  }
  int active_streams() const;
  // UNAVAILABLE with a sluice.v1.HandedBack detail, saying `what`.
  static absl::Status HandedBackStatus(absl::string_view what);
  static bool IsHandedBack(const absl::Status& status);
  // Sample ranges whose newest fence is remembered (tests: the memory
  // bound).
  size_t fence_units() const;
  // The newest fence presented to this server, over all jobs (0 = none).
  uint64_t max_fence_seen() const;

  FairPool& pool() { return pool_; }
  DecodeMemoryBudget& decode_budget() { return decode_budget_; }
  // Null when --shared_decode_bytes is 0.
  DecodedImageCache* decoded_images() { return decoded_images_.get(); }
  DataServerMetrics* metrics() { return options_.metrics; }
  const DataServerOptions& options() const { return options_; }

 private:
  explicit DataServerService(DataServerOptions options);
  // Every message of `stream`, merged; `done` at its end or error.
  static void CollectBatch(
      std::shared_ptr<SampleStream> stream,
      std::function<void(absl::StatusOr<v1::SampleBatch>)> done);
  // A replay's stream and what it has sent so far.
  struct ReplayPump {
    std::shared_ptr<SampleStream> stream;
    v1::SampleBatch batch;
    std::function<void(absl::StatusOr<v1::SampleBatch>)> done;
    // Asks for the next message; at the end (or an error), calls `done`.
    static void Pull(const std::shared_ptr<ReplayPump>& pump);
  };
  // A ReplayDraws call: the leases planned so far.
  struct DrawsPlan {
    v1::ReplayDrawsRequest request;
    std::optional<ImageTransforms> transforms;
    v1::ReplayDrawsResponse response;
    std::function<void(absl::StatusOr<v1::ReplayDrawsResponse>)> done;
  };
  // Plans the next lease of `plan`, or calls its `done` after the last.
  void NextDraws(const std::shared_ptr<DrawsPlan>& plan);
  // The replay lease's sample with its fields (`fields` of them; empty =
  // all) undecoded.
  void RawSample(const v1::Lease& lease,
                 const google::protobuf::RepeatedPtrField<std::string>& fields,
                 std::function<void(absl::StatusOr<v1::Sample>)> done);
  // ReadSamples, with or without the fence check (a replay has none).
  absl::StatusOr<std::shared_ptr<SampleStream>> OpenStream(
      const v1::ReadRequest& request, bool check_fence);
  absl::Status CheckFence(const v1::Lease& lease);
  // ABORTED when the lease's signed expiry passed more than lease_clock_skew
  // ago.
  absl::Status CheckExpiry(const v1::Lease& lease) const;
  absl::StatusOr<v1::ShardIndex> IndexOf(
      const v1::IndexShardRequest& request,
      const std::shared_ptr<const ShardData>& shard);
  // A shuffle window's labels (WindowLabels), from a small cache: the units
  // of one window share them.
  std::shared_ptr<const std::vector<uint16_t>> LabelsFor(
      const std::vector<int64_t>& sizes, uint64_t order_seed);

  DataServerOptions options_;
  SampleIndexCache index_cache_;
  DecodeMemoryBudget decode_budget_;
  std::unique_ptr<DecodedImageCache> decoded_images_;  // null = off

  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> handing_back_{false};
  // Most recently used first; keyed by the window's order seed and piece
  // sizes.
  std::list<
      std::pair<std::string, std::shared_ptr<const std::vector<uint16_t>>>>
      labels_ ABSL_GUARDED_BY(mu_);
  int active_streams_ ABSL_GUARDED_BY(mu_) = 0;
  // Open streams by tenant, with --max_streams_per_tenant (none at 0).
  absl::flat_hash_map<std::string, int> tenant_streams_ ABSL_GUARDED_BY(mu_);
  FenceTracker fences_ ABSL_GUARDED_BY(mu_);

  // What this server's streams use of it.
  StreamContext stream_context_;
  // Last: destroyed first, so that its tasks (and the streams they hold)
  // finish while everything above is still there.
  FairPool pool_;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_DATASERVER_SERVICE_H_
