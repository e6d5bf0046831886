#include "server/dataserver/dataserver_metrics.h"

#include "absl/status/status.h"

namespace sluice::dataserver {
namespace {

prometheus::Family<prometheus::Counter>& Counters(prometheus::Registry& r,
                                                  const char* name,
                                                  const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

}  // namespace

const char* CorruptReasonLabel(CorruptReason reason) {
  switch (reason) {
    case CorruptReason::kDamagedTar:
      return "damaged_tar";
    case CorruptReason::kDuplicateField:
      return "duplicate_field";
    case CorruptReason::kUndecodable:
      return "undecodable";
    case CorruptReason::kLost:
      return "lost_after_damage";
  }
  return "unknown";
}

DataServerMetrics::DataServerMetrics(prometheus::Registry& r,
                                     absl::Duration job_retention,
                                     const Clock* clock)
    : samples_served(
          Counters(r, "sluice_dataserver_samples_served_total",
                   "Samples sent to trainers (skipped ones included).")
              .Add({})),
      streams_handed_back(
          Counters(r, "sluice_dataserver_streams_handed_back_total",
                   "Streams ended early or refused while the server drained: "
                   "the rest of each lease went back to the coordinator "
                   "(not errors).")
              .Add({})),
      images_transformed(
          Counters(r, "sluice_dataserver_images_transformed_total",
                   "Image fields that went through DecodeSpec transforms.")
              .Add({})),

      active_streams(prometheus::BuildGauge()
                         .Name("sluice_dataserver_active_streams")
                         .Help("ReadSamples streams in progress.")
                         .Register(r)
                         .Add({})),
      decode_memory_bytes(
          prometheus::BuildGauge()
              .Name("sluice_dataserver_decode_memory_bytes")
              .Help("Estimated bytes of the samples being decoded, across "
                    "streams (bounded by --max_decode_memory).")
              .Register(r)
              .Add({})),
      index_cache_hits(Counters(r, "sluice_dataserver_index_cache_hits_total",
                                "Shard index lookups served from the cache.")
                           .Add({})),
      index_cache_misses(Counters(r,
                                  "sluice_dataserver_index_cache_misses_total",
                                  "Shard index lookups that scanned the shard.")
                             .Add({})),
      shards_changed(
          Counters(r, "sluice_dataserver_shards_changed_while_served_total",
                   "Streams ended with DATA_LOSS because their shard file was "
                   "truncated or rewritten in place while being read.")
              .Add({})),
      cache_hits(Counters(r, "sluice_dataserver_cache_hits_total",
                          "Remote shard opens served from the shard cache.")
                     .Add({})),
      cache_misses(Counters(r, "sluice_dataserver_cache_misses_total",
                            "Remote shard opens that waited on a download "
                            "(joining one in flight included).")
                       .Add({})),
      cache_evictions(Counters(r, "sluice_dataserver_cache_evictions_total",
                               "Shards removed from the cache to stay under "
                               "--cache_bytes.")
                          .Add({})),
      cache_downloaded_bytes(
          Counters(r, "sluice_dataserver_cache_downloaded_bytes_total",
                   "Bytes of shards downloaded into the cache.")
              .Add({})),
      cache_download_seconds(
          prometheus::BuildHistogram()
              .Name("sluice_dataserver_cache_download_seconds")
              .Help("Time to download, verify and install one shard, retries "
                    "included.")
              .Register(r)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1,
                                                               0.25, 0.5, 1,
                                                               2.5, 5, 10, 30,
                                                               60, 120, 300})),
      cache_bytes(
          prometheus::BuildGauge()
              .Name("sluice_dataserver_cache_bytes")
              .Help("Bytes of complete shards in the cache directory (this "
                    "process's accounting).")
              .Register(r)
              .Add({})),
      shared_decode_bytes(
          prometheus::BuildGauge()
              .Name("sluice_dataserver_shared_decode_bytes")
              .Help("Bytes of decoded images held for the jobs that read the "
                    "same shards (--shared_decode_bytes).")
              .Register(r)
              .Add({})),
      job_retention_(job_retention),
      clock_(clock),
      decode_seconds_(
          prometheus::BuildHistogram()
              .Name("sluice_dataserver_decode_seconds")
              .Help("Time to decode one field, by codec (transform steps "
                    "included).")
              .Register(r)),
      transform_seconds_(
          prometheus::BuildHistogram()
              .Name("sluice_dataserver_transform_seconds")
              .Help("Time in the transform steps of one image field, by op "
                    "(resize, crop, output).")
              .Register(r)),
      decoder_cpu_seconds_(
          prometheus::BuildCounter()
              .Name("sluice_dataserver_decoder_cpu_seconds_total")
              .Help("Thread CPU seconds in the image decoders themselves, by "
                    "codec (jpeg, png): transforms excluded; an image shared "
                    "between jobs counted once.")
              .Register(r)),
      skipped_(Counters(
          r, "sluice_dataserver_samples_skipped_total",
          "Samples reported as skipped (on_corrupt=skip), by reason and "
          "job (sluice_job).")),
      job_samples_(Counters(r, "sluice_dataserver_job_samples_total",
                            "Samples sent to trainers, by job (sluice_job).")),
      job_cpu_seconds_(Counters(
          r, "sluice_dataserver_job_cpu_seconds_total",
          "CPU seconds the server's reading and decoding threads spent on "
          "each job's work (sluice_job): a job's share of the server is its "
          "rate "
          "over the sum of all jobs' rates.")),
      corrupt_(
          Counters(r, "sluice_dataserver_corrupt_samples_total",
                   "Corrupt samples found, under either policy, by reason.")),
      shared_decodes_(Counters(
          r, "sluice_dataserver_shared_decodes_total",
          "Image fields of shards that other jobs read at the same time: hit "
          "= decoded once for another job and reused, miss = decoded by this "
          "job and kept for the others.")),
      shared_decode_hits_(shared_decodes_.Add({{"result", "hit"}})),
      shared_decode_misses_(shared_decodes_.Add({{"result", "miss"}})),
      stream_errors_(Counters(r, "sluice_dataserver_stream_errors_total",
                              "ReadSamples/IndexShard calls that ended in an "
                              "error, by gRPC status code.")),
      download_failures_(
          Counters(r, "sluice_dataserver_cache_download_failures_total",
                   "Shard downloads that failed (after retries), by "
                   "reason.")),
      bytes_served_(Counters(
          r, "sluice_dataserver_bytes_served_total",
          "Bytes of SampleBatch messages sent to trainers, by locality: "
          "same_node (the reader named this server's node), other_node, or "
          "unknown (either did not name one).")),
      bytes_same_node_(bytes_served_.Add({{"locality", "same_node"}})),
      bytes_other_node_(bytes_served_.Add({{"locality", "other_node"}})),
      bytes_unknown_node_(bytes_served_.Add({{"locality", "unknown"}})) {
  // Bounded label sets exported from start-up at 0, so a rate or an alert
  // sees the first occurrence as an increase (and dashboards have series).
  for (CorruptReason reason :
       {CorruptReason::kDamagedTar, CorruptReason::kDuplicateField,
        CorruptReason::kUndecodable, CorruptReason::kLost}) {
    Skipped(reason);
    Corrupt(reason);
  }
  for (int code = 1; code <= 16; ++code) {
    StreamErrors(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
  }
}

prometheus::Counter& DataServerMetrics::SharedDecodes(bool hit) {
  return hit ? shared_decode_hits_ : shared_decode_misses_;
}

prometheus::Counter& DataServerMetrics::BytesServed(Locality locality) {
  switch (locality) {
    case Locality::kSameNode:
      return bytes_same_node_;
    case Locality::kOtherNode:
      return bytes_other_node_;
    case Locality::kUnknown:
      break;
  }
  return bytes_unknown_node_;
}

Locality LocalityOf(absl::string_view server_node,
                    absl::string_view reader_node) {
  if (server_node.empty() || reader_node.empty()) return Locality::kUnknown;
  return server_node == reader_node ? Locality::kSameNode
                                    : Locality::kOtherNode;
}

prometheus::Counter& DataServerMetrics::DownloadFailures(
    const std::string& reason) {
  return download_failures_.Add({{"reason", reason}});
}

prometheus::Histogram& DataServerMetrics::DecodeSeconds(const char* codec) {
  // JPEG decodes take ~1 ms at 500x375 on one core; text/int take microseconds.
  return decode_seconds_.Add(
      {{"codec", codec}}, prometheus::Histogram::BucketBoundaries{
                              0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                              0.0025, 0.005, 0.01, 0.025, 0.1});
}

prometheus::Histogram& DataServerMetrics::TransformSeconds(const char* op) {
  return transform_seconds_.Add(
      {{"op", op}}, prometheus::Histogram::BucketBoundaries{
                        0.000005, 0.00001, 0.00005, 0.0001, 0.00025, 0.0005,
                        0.001, 0.0025, 0.005, 0.01});
}

prometheus::Counter& DataServerMetrics::DecoderCpuSeconds(const char* codec) {
  return decoder_cpu_seconds_.Add({{"codec", codec}});
}

prometheus::Counter& DataServerMetrics::Skipped(CorruptReason reason,
                                                const std::string& job) {
  if (job.empty())
    return skipped_.Add({{"reason", CorruptReasonLabel(reason)}});
  return skipped_.Add(
      {{"reason", CorruptReasonLabel(reason)}, {"sluice_job", job}});
}

DataServerMetrics::JobSeries DataServerMetrics::HoldJob(
    const std::string& job) {
  absl::MutexLock lock(&jobs_mu_);
  ExpireJobsLocked(clock_->Now());
  ++jobs_[job].streams;
  return JobSeries{&job_samples_.Add({{"sluice_job", job}}),
                   &job_cpu_seconds_.Add({{"sluice_job", job}})};
}

void DataServerMetrics::ReleaseJob(const std::string& job) {
  absl::MutexLock lock(&jobs_mu_);
  const absl::Time now = clock_->Now();
  if (auto it = jobs_.find(job); it != jobs_.end() && --it->second.streams == 0)
    it->second.idle_since = now;
  ExpireJobsLocked(now);
}

size_t DataServerMetrics::jobs_exported() const {
  absl::MutexLock lock(&jobs_mu_);
  return jobs_.size();
}

void DataServerMetrics::ExpireJobsLocked(absl::Time now) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second.streams > 0 ||
        now - it->second.idle_since < job_retention_) {
      ++it;
      continue;
    }
    const prometheus::Labels job = {{"sluice_job", it->first}};
    job_samples_.Remove(&job_samples_.Add(job));
    job_cpu_seconds_.Remove(&job_cpu_seconds_.Add(job));
    for (CorruptReason reason :
         {CorruptReason::kDamagedTar, CorruptReason::kDuplicateField,
          CorruptReason::kUndecodable, CorruptReason::kLost}) {
      const prometheus::Labels skipped = {
          {"reason", CorruptReasonLabel(reason)}, {"sluice_job", it->first}};
      if (skipped_.Has(skipped)) skipped_.Remove(&skipped_.Add(skipped));
    }
    it = jobs_.erase(it);
  }
}

prometheus::Counter& DataServerMetrics::Corrupt(CorruptReason reason) {
  return corrupt_.Add({{"reason", CorruptReasonLabel(reason)}});
}

prometheus::Counter& DataServerMetrics::StreamErrors(const std::string& code) {
  return stream_errors_.Add({{"code", code}});
}

}  // namespace sluice::dataserver
