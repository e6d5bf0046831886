// sluice-dataserver: streams samples of WebDataset tar shards to trainers.
#include <prometheus/registry.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/common/lease_token.h"
#include "server/common/logging.h"
#include "server/common/node_name.h"
#include "server/common/pool_name.h"
#include "server/common/server_host.h"
#include "server/common/status_macros.h"
#include "server/common/tls_files.h"
#include "server/dataserver/composite_shard_store.h"
#include "server/dataserver/coordinator_registration.h"
#include "server/dataserver/dataserver_metrics.h"
#include "server/dataserver/dataserver_service.h"
#include "server/dataserver/grpc_dataserver_service.h"
#include "server/dataserver/shard_cache.h"

ABSL_FLAG(std::vector<std::string>, roots, {},
          "Comma-separated directories local shards may be read from. "
          "Anything resolving outside them (\"..\", symlinks) is "
          "PERMISSION_DENIED. Required unless --cache_dir is set (a server of "
          "remote shards only).");
ABSL_FLAG(std::string, cache_dir, "",
          "Directory remote shards (http://, https://, s3://) are downloaded "
          "to and served from. Empty = remote shards are refused "
          "(FAILED_PRECONDITION). The server holds it for its life (an "
          "flock on <dir>/LOCK): a second server on it is refused, naming "
          "the holder's PID, unless both set --shared_cache_dir.");
ABSL_FLAG(bool, shared_cache_dir, false,
          "Let several data servers use one --cache_dir at once (none takes "
          "its lock). Correct, but each counts only its own bytes against "
          "--cache_bytes.");
ABSL_FLAG(
    int64_t, cache_bytes, int64_t{100} << 30,
    "Upper bound on the bytes of shards kept in --cache_dir (LRU of whole "
    "shards; shards being read are never evicted). 0 = unbounded.");
ABSL_FLAG(int64_t, cache_min_free_bytes, int64_t{1} << 30,
          "Also evict unpinned cached shards while the cache's filesystem has "
          "less than this "
          "free (plus room for downloads in flight). 0 = no check.");
ABSL_FLAG(int, download_threads, 4, "Shard downloads running at once.");
ABSL_FLAG(int, download_attempts, 5,
          "Attempts per shard download (retries on 5xx, timeouts, truncated "
          "bodies, with jittered exponential backoff).");
ABSL_FLAG(std::string, ca_bundle, "",
          "PEM file of CA certificates for https:// shards; empty = the "
          "system's. TLS verification is always on.");
ABSL_FLAG(std::string, s3_endpoint, "",
          "Endpoint for s3:// shards (path-style, e.g. "
          "http://127.0.0.1:9000); empty = $AWS_ENDPOINT_URL_S3, "
          "$AWS_ENDPOINT_URL, then https://s3.<region>.amazonaws.com. "
          "Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
          "AWS_SESSION_TOKEN (requests are unsigned without them).");
ABSL_FLAG(std::string, s3_region, "",
          "Region for SigV4 signing; empty = $AWS_REGION, $AWS_DEFAULT_REGION, "
          "then us-east-1.");
ABSL_FLAG(int, prefetch, 4,
          "Remote shards to download ahead of their first read, from the "
          "coordinator's hints of upcoming units (0 = off).");
ABSL_FLAG(absl::Duration, lease_clock_skew, absl::Seconds(30),
          "With --lease_secret_file: a lease token past its signed expiry by "
          "more than this "
          "is refused (ABORTED). The coordinator re-signs held leases before "
          "half their TTL "
          "is left, so only a token kept after its lease ended is refused.");
ABSL_FLAG(std::string, lease_secret_file, "",
          "File holding the lease-token secret shared with the coordinator. "
          "Set = every ReadSamples must carry a valid token. Empty = tokens "
          "are not checked (trusted networks only).");
ABSL_FLAG(int, index_cache_entries, 4096,
          "Shard indexes kept in memory (LRU).");
ABSL_FLAG(int, decode_threads, 0,
          "Worker threads for tar reading and decoding; 0 = one per core.");
ABSL_FLAG(int32_t, max_streams_per_tenant, 0,
          "Streams one tenant's readers (JobSpec.tenant) may have open on "
          "this server at once; a read beyond it is RESOURCE_EXHAUSTED and "
          "the reader retries it with back-off. 0 = no limit.");
ABSL_FLAG(int64_t, default_batch_bytes, 1 << 20,
          "SampleBatch size when a request does not set max_batch_bytes.");
ABSL_FLAG(int64_t, max_image_pixels, sluice::dataserver::kDefaultMaxImagePixels,
          "Images whose header claims more pixels are corrupt samples (skipped "
          "or DATA_LOSS "
          "per the job's on_corrupt), refused before any pixel memory is "
          "allocated. 0 = no "
          "limit. The default is PIL's DecompressionBombError threshold.");
ABSL_FLAG(int64_t, max_sample_bytes, sluice::dataserver::kDefaultMaxSampleBytes,
          "A member of a compressed (.tar.gz ...) shard larger than this makes "
          "its sample "
          "corrupt (skipped or DATA_LOSS per on_corrupt) instead of being "
          "decompressed into "
          "memory. Uncompressed shards are served from their mapping.");
ABSL_FLAG(int64_t, max_decode_memory, int64_t{1} << 30,
          "Bytes the samples being decoded may hold at once, across all "
          "streams (estimated "
          "from each image's header: its full-size pixels and the resampling "
          "buffers); a "
          "sample waits for room before it is decoded (each job's in the "
          "order they were read, jobs by weight). One "
          "sample larger than this still decodes, alone. 0 = no bound.");
ABSL_FLAG(
    int64_t, shared_decode_bytes, int64_t{256} << 20,
    "Bytes of decoded images kept for jobs that read the same shard at "
    "the same time (a sweep of trials over one dataset): each JPEG or "
    "PNG is then decoded once, whole, and every job crops and transforms its "
    "own view of it (the same tensors as a job alone). Used only for "
    "shards that another job has a stream open on. 0 = off.");
ABSL_FLAG(absl::Duration, job_metrics_retention, absl::Minutes(15),
          "How long a job's series (sluice_job label) stay exported after its "
          "last stream on this server ended.");
ABSL_FLAG(int64_t, max_batch_bytes, 16 << 20,
          "Upper bound on a request's max_batch_bytes (clients must accept "
          "messages this big).");
ABSL_FLAG(std::string, coordinator, "",
          "Coordinator HOST:PORT to register with (and heartbeat to); empty = "
          "standalone. Re-registers when the coordinator restarts. Several "
          "IPv4 HOST:PORTs, comma-separated: the one whose readiness is "
          "SERVING (with an etcd journal, the leading coordinator).");
ABSL_FLAG(std::string, coordinator_ca, "",
          "PEM CA certificate(s) to verify the coordinator with: set = "
          "register over TLS "
          "(a coordinator started with --tls_cert). Empty = plaintext.");
ABSL_FLAG(std::string, coordinator_cert, "",
          "PEM client certificate for mutual TLS with the coordinator (its "
          "--tls_client_ca).");
ABSL_FLAG(std::string, coordinator_key, "",
          "PEM private key for --coordinator_cert.");
ABSL_FLAG(std::string, advertise, "",
          "Address trainers use to reach this server. Default: the --listen "
          "host and bound port (the hostname when listening on 0.0.0.0/::).");
ABSL_FLAG(int, capacity, 1, "Relative routing weight sent to the coordinator.");
ABSL_FLAG(std::string, node, "",
          "The node (host) this server runs on, sent to the coordinator: "
          "readers on the same node read from it first. Default: "
          "$SLUICE_NODE, else $SLURMD_NODENAME, else the host name.");
ABSL_FLAG(std::string, pool, "",
          "The data-server pool this server serves (JobSpec.pool; 0-64 "
          "characters of [A-Za-z0-9._-]): only jobs of that pool are routed "
          "to it, and the coordinator sizes each pool apart. Default: the "
          "default pool.");

namespace {

using sluice::dataserver::CompositeShardStore;
using sluice::dataserver::CoordinatorRegistration;
using sluice::dataserver::DataServerMetrics;
using sluice::dataserver::DataServerOptions;
using sluice::dataserver::DataServerService;
using sluice::dataserver::GrpcDataServerService;
using sluice::dataserver::LocalShardStore;
using sluice::dataserver::RemoteFetcher;
using sluice::dataserver::RemoteFetcherOptions;
using sluice::dataserver::ShardCache;
using sluice::dataserver::ShardCacheOptions;

class DataServerServices : public sluice::ServiceSet {
 public:
  static absl::StatusOr<std::unique_ptr<DataServerServices>> Create(
      std::shared_ptr<prometheus::Registry> registry) {
    auto s = std::unique_ptr<DataServerServices>(new DataServerServices());
    const absl::Duration retention = absl::GetFlag(FLAGS_job_metrics_retention);
    if (retention < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          "--job_metrics_retention must not be negative");
    }
    s->metrics_ = std::make_unique<DataServerMetrics>(*registry, retention);
    DataServerOptions options;
    std::unique_ptr<LocalShardStore> local;
    const std::vector<std::string> roots = absl::GetFlag(FLAGS_roots);
    const std::string cache_dir = absl::GetFlag(FLAGS_cache_dir);
    if (!roots.empty() || cache_dir.empty()) {
      ASSIGN_OR_RETURN(local, LocalShardStore::Create(roots));
    }
    std::shared_ptr<ShardCache> cache;
    if (!cache_dir.empty()) {
      RemoteFetcherOptions fetch;
      fetch.ca_bundle = absl::GetFlag(FLAGS_ca_bundle);
      fetch.max_attempts = absl::GetFlag(FLAGS_download_attempts);
      fetch.s3_endpoint = absl::GetFlag(FLAGS_s3_endpoint);
      fetch.s3_region = absl::GetFlag(FLAGS_s3_region);
      if (fetch.max_attempts < 1) {
        return absl::InvalidArgumentError(
            "--download_attempts must be at least 1");
      }
      if (!fetch.ca_bundle.empty() &&
          access(fetch.ca_bundle.c_str(), R_OK) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--ca_bundle \"", fetch.ca_bundle, "\" is not readable"));
      }
      ShardCacheOptions cache_options;
      cache_options.dir = cache_dir;
      cache_options.shared_dir = absl::GetFlag(FLAGS_shared_cache_dir);
      cache_options.max_bytes = absl::GetFlag(FLAGS_cache_bytes);
      cache_options.min_free_bytes = absl::GetFlag(FLAGS_cache_min_free_bytes);
      if (cache_options.min_free_bytes < 0) {
        return absl::InvalidArgumentError(
            "--cache_min_free_bytes must be >= 0");
      }
      cache_options.download_threads = absl::GetFlag(FLAGS_download_threads);
      cache_options.metrics = s->metrics_.get();
      cache_options.max_queued_prefetches = absl::GetFlag(FLAGS_prefetch);
      if (cache_options.download_threads < 1) {
        return absl::InvalidArgumentError(
            "--download_threads must be at least 1");
      }
      ASSIGN_OR_RETURN(
          cache, ShardCache::Create(std::move(cache_options),
                                    std::make_unique<RemoteFetcher>(fetch)));
    }
    if (absl::GetFlag(FLAGS_prefetch) < 0) {
      return absl::InvalidArgumentError("--prefetch must be >= 0");
    }
    s->cache_ = cache.get();
    ASSIGN_OR_RETURN(
        s->coordinator_credentials_,
        sluice::ClientCredentialsFromFiles(sluice::ClientTlsFiles{
            absl::GetFlag(FLAGS_coordinator_ca),
            absl::GetFlag(FLAGS_coordinator_cert),
            absl::GetFlag(FLAGS_coordinator_key), "--coordinator_ca",
            "--coordinator_cert", "--coordinator_key"}));
    options.store = std::make_unique<CompositeShardStore>(std::move(local),
                                                          std::move(cache));
    ASSIGN_OR_RETURN(
        options.lease_secret,
        sluice::ReadSecretFile(absl::GetFlag(FLAGS_lease_secret_file),
                               "lease_secret_file"));
    if (options.lease_secret.empty()) {
      sluice::LogWarning(
          "no --lease_secret_file: lease tokens are not checked; anyone who "
          "can reach this port can read shards under --roots");
    }
    if (absl::GetFlag(FLAGS_index_cache_entries) <= 0) {
      return absl::InvalidArgumentError(
          "--index_cache_entries must be positive");
    }
    options.index_cache_entries =
        static_cast<size_t>(absl::GetFlag(FLAGS_index_cache_entries));
    options.decode_threads = absl::GetFlag(FLAGS_decode_threads);
    options.default_batch_bytes = absl::GetFlag(FLAGS_default_batch_bytes);
    options.max_batch_bytes = absl::GetFlag(FLAGS_max_batch_bytes);
    options.max_image_pixels = absl::GetFlag(FLAGS_max_image_pixels);
    options.max_streams_per_tenant =
        absl::GetFlag(FLAGS_max_streams_per_tenant);
    options.lease_clock_skew = absl::GetFlag(FLAGS_lease_clock_skew);
    options.max_sample_bytes = absl::GetFlag(FLAGS_max_sample_bytes);
    options.max_decode_memory = absl::GetFlag(FLAGS_max_decode_memory);
    options.shared_decode_bytes = absl::GetFlag(FLAGS_shared_decode_bytes);
    if (options.shared_decode_bytes < 0) {
      return absl::InvalidArgumentError(
          "--shared_decode_bytes must be 0 (off) or positive");
    }
    if (options.default_batch_bytes <= 0 || options.max_batch_bytes <= 0) {
      return absl::InvalidArgumentError(
          "--default_batch_bytes and --max_batch_bytes must be positive");
    }
    options.metrics = s->metrics_.get();
    options.node = absl::GetFlag(FLAGS_node).empty()
                       ? sluice::NodeName()
                       : absl::GetFlag(FLAGS_node);
    ASSIGN_OR_RETURN(s->logic_, DataServerService::Create(std::move(options)));
    s->grpc_ = std::make_unique<GrpcDataServerService>(s->logic_.get());
    return s;
  }

  std::vector<grpc::Service*> services() override { return {grpc_.get()}; }
  // Leaving without loss: the coordinator routes nothing new here, and new
  // reads are refused (HandedBack: the reader gives the lease back). Open
  // streams finish for up to half the drain timeout; then each ends at its
  // next batch handing the rest of its lease back. The registration ends
  // once no call has been open for kDrainQuiet (a reader's next unit may
  // still arrive here, and learns of the drain) or at 90 % of the drain
  // timeout; gRPC cancels what is left at the timeout.
  void Drain(absl::Duration timeout) override {
    constexpr absl::Duration kDrainQuiet = absl::Milliseconds(250);
    const absl::Time start = absl::Now();
    if (registration_ != nullptr) registration_->Drain();
    logic_->Drain();
    const int open = grpc_->open_calls();
    const absl::Duration quiet = std::min(kDrainQuiet, timeout / 4);
    if (!grpc_->AwaitQuiet(quiet, start + timeout / 2)) {
      if (const int left = grpc_->open_calls(); left > 0) {
        sluice::LogInfo(
            "draining: %d of %d streams still open after %s; handing the "
            "rest of their leases back",
            left, open, absl::FormatDuration(absl::Now() - start));
      }
      logic_->HandBack();
      if (!grpc_->AwaitQuiet(quiet, start + timeout * 0.9) &&
          grpc_->open_calls() > 0) {
        sluice::LogWarning(
            "draining: %d streams still open after %s; cancelled at the drain "
            "timeout",
            grpc_->open_calls(), absl::FormatDuration(absl::Now() - start));
      }
    }
    if (registration_ != nullptr) registration_->Stop();
  }

  absl::Status Started(const sluice::HostPort& bound) override {
    const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
    if (coordinator.empty()) return absl::OkStatus();
    // One HOST:PORT, or several (the coordinators of an etcd journal).
    for (absl::string_view one : absl::StrSplit(coordinator, ',')) {
      RETURN_IF_ERROR(
          sluice::ParseHostPort(std::string(one), "coordinator").status());
    }
    CoordinatorRegistration::Options options;
    options.coordinator = coordinator;
    options.advertise = absl::GetFlag(FLAGS_advertise);
    if (options.advertise.empty()) {
      std::string host = bound.host;
      if (host == "0.0.0.0" || host == "::" || host == "[::]" || host.empty()) {
        char name[256] = {0};
        gethostname(name, sizeof(name) - 1);
        host = name;
      }
      options.advertise = absl::StrCat(host, ":", bound.port);
    }
    options.capacity = absl::GetFlag(FLAGS_capacity);
    options.node = logic_->options().node;
    options.pool = absl::GetFlag(FLAGS_pool);
    if (!sluice::ValidPoolName(options.pool)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pool=", options.pool,
                       ": a pool name is 0-64 characters of [A-Za-z0-9._-]"));
    }
    // Null = plaintext (what the registration's error messages go by).
    if (!absl::GetFlag(FLAGS_coordinator_ca).empty()) {
      options.credentials = coordinator_credentials_;
    }
    if (!logic_->options().lease_secret.empty()) {
      options.credential = sluice::SignRegistration(
          options.advertise, logic_->options().lease_secret);
    }
    DataServerService* logic = logic_.get();
    options.active_streams = [logic] { return logic->active_streams(); };
    options.max_fence_seen = [logic] { return logic->max_fence_seen(); };
    if (logic->metrics() != nullptr) {
      options.samples_served = [logic] {
        return static_cast<int64_t>(logic->metrics()->samples_served.Value());
      };
    }
    options.cores = static_cast<int32_t>(logic->pool().size());
    if (cache_ != nullptr && absl::GetFlag(FLAGS_prefetch) > 0) {
      ShardCache* cache = cache_;
      options.on_prefetch = [cache](const sluice::v1::PrefetchHint& hint) {
        for (const sluice::v1::Shard& shard : hint.shards()) {
          cache->Prefetch({shard.url(), shard.size_bytes(), shard.checksum()});
        }
      };
    }
    registration_ =
        std::make_unique<CoordinatorRegistration>(std::move(options));
    registration_->Start();
    return absl::OkStatus();
  }

 private:
  DataServerServices() = default;
  std::unique_ptr<DataServerMetrics> metrics_;
  std::unique_ptr<DataServerService> logic_;
  std::unique_ptr<GrpcDataServerService> grpc_;
  std::unique_ptr<CoordinatorRegistration> registration_;
  ShardCache* cache_ = nullptr;  // owned by the store; null without --cache_dir
  std::shared_ptr<grpc::ChannelCredentials> coordinator_credentials_;
};

}  // namespace

int main(int argc, char** argv) {
  sluice::ServerMainOptions options;
  options.program = "sluice-dataserver";
  options.usage =
      "Streams samples of WebDataset tar shards to trainers.\n\n"
      "Usage: sluice-dataserver --roots=/data/shards [flags]\n"
      "       sluice-dataserver --cache_dir=/var/cache/sluice [flags]  (remote "
      "shards)\n"
      "Stops cleanly on SIGTERM/SIGINT (exit 0).";
  options.default_listen = "0.0.0.0:7071";
  options.default_metrics_listen = "0.0.0.0:9071";
  options.make_services = [](std::shared_ptr<prometheus::Registry> registry)
      -> absl::StatusOr<std::unique_ptr<sluice::ServiceSet>> {
    ASSIGN_OR_RETURN(auto services,
                     DataServerServices::Create(std::move(registry)));
    return std::unique_ptr<sluice::ServiceSet>(std::move(services));
  };
  return sluice::RunServerMain(argc, argv, options);
}
