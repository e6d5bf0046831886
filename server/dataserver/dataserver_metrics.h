// Prometheus metrics of a data server. Labels are bounded: codec (six
// values), skip reason (a fixed set), gRPC status code, and job (the jobs
// with streams on the server lately, the name cut to 128 bytes: a job's
// series go `job_retention` after its last stream ended).
#ifndef SLUICE_SERVER_DATASERVER_DATASERVER_METRICS_H_
#define SLUICE_SERVER_DATASERVER_DATASERVER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/common/clock.h"

namespace sluice::dataserver {

// Bounded set of reasons for skipped / corrupt samples.
enum class CorruptReason { kDamagedTar, kDuplicateField, kUndecodable, kLost };
const char* CorruptReasonLabel(CorruptReason reason);

// Whether a reader is on the server's node (both named: RegisterDataServer
// and ReadRequest's node).
enum class Locality { kSameNode, kOtherNode, kUnknown };
Locality LocalityOf(absl::string_view server_node,
                    absl::string_view reader_node);

class DataServerMetrics {
 public:
  // A job's series (sluice_job) are removed `job_retention` after its last
  // stream ended (Prometheus has scraped their final values by then), at
  // the next HoldJob or ReleaseJob: a server that outlives many jobs does
  // not export every one of them for ever.
  explicit DataServerMetrics(prometheus::Registry& registry,
                             absl::Duration job_retention = absl::Minutes(15),
                             const Clock* clock = Clock::Real());

  prometheus::Histogram& DecodeSeconds(const char* codec);
  // Time in transform steps of one image field, by op: "resize", "crop",
  // "output" (flips, layout, float conversion).
  prometheus::Histogram& TransformSeconds(const char* op);
  // Thread CPU seconds in the image decoder libraries themselves, by codec
  // (jpeg, png): without the transforms, and with an image shared between
  // jobs counted once, by the call that decoded it.
  prometheus::Counter& DecoderCpuSeconds(const char* codec);
  // Skipped samples by reason, and by job when `job` is given (a series
  // per job appears with its first skip; the job-less series are exported
  // from start-up at 0).
  prometheus::Counter& Skipped(CorruptReason reason,
                               const std::string& job = "");
  prometheus::Counter& Corrupt(CorruptReason reason);
  prometheus::Counter& StreamErrors(const std::string& code);
  // `reason` is a FetchFailureLabel (a fixed set).
  prometheus::Counter& DownloadFailures(const std::string& reason);

  // Per job (sluice_job; a job's series appear with its first stream):
  // samples sent, and CPU seconds the server's reading and decoding threads
  // spent on the job's work (its share of the server: its rate over the
  // sum of all jobs' rates). A stream holds its job's series from
  // HoldJob until ReleaseJob; Skipped(reason, job) is for a held job.
  struct JobSeries {
    prometheus::Counter* samples = nullptr;
    prometheus::Counter* cpu_seconds = nullptr;
  };
  JobSeries HoldJob(const std::string& job);
  void ReleaseJob(const std::string& job);
  // Jobs whose series are exported now.
  size_t jobs_exported() const;

  prometheus::Counter& samples_served;
  // Streams ended or refused while draining, their leases handed back.
  prometheus::Counter& streams_handed_back;
  // Image fields that went through DecodeSpec transforms.
  prometheus::Counter& images_transformed;
  // Bytes of SampleBatch messages sent, by whether the reader is on this
  // server's node.
  prometheus::Counter& BytesServed(Locality locality);
  prometheus::Gauge& active_streams;
  // Estimated bytes of samples being decoded (--max_decode_memory).
  prometheus::Gauge& decode_memory_bytes;
  prometheus::Counter& index_cache_hits;
  prometheus::Counter& index_cache_misses;
  // Streams ended because their shard was truncated or rewritten in place.
  prometheus::Counter& shards_changed;
  // Shard cache (remote shards).
  prometheus::Counter& cache_hits;
  prometheus::Counter& cache_misses;
  prometheus::Counter& cache_evictions;
  prometheus::Counter& cache_downloaded_bytes;
  prometheus::Histogram& cache_download_seconds;
  prometheus::Gauge& cache_bytes;
  // Shared decoding (--shared_decode_bytes): image fields of shards that
  // other jobs read too, by whether another stream had decoded the image
  // (hit) or this one decoded it (miss); and the pixels held.
  prometheus::Counter& SharedDecodes(bool hit);
  prometheus::Gauge& shared_decode_bytes;

 private:
  struct HeldJob {
    int streams = 0;
    absl::Time idle_since;  // when `streams` fell to 0
  };
  // Removes the series of jobs idle for job_retention_.
  void ExpireJobsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(jobs_mu_);

  const absl::Duration job_retention_;
  const Clock* const clock_;
  mutable absl::Mutex jobs_mu_;
  std::map<std::string, HeldJob> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  prometheus::Family<prometheus::Histogram>& decode_seconds_;
  prometheus::Family<prometheus::Histogram>& transform_seconds_;
  prometheus::Family<prometheus::Counter>& decoder_cpu_seconds_;
  prometheus::Family<prometheus::Counter>& skipped_;
  prometheus::Family<prometheus::Counter>& job_samples_;
  prometheus::Family<prometheus::Counter>& job_cpu_seconds_;
  prometheus::Family<prometheus::Counter>& corrupt_;
  prometheus::Family<prometheus::Counter>& shared_decodes_;
  prometheus::Counter& shared_decode_hits_;
  prometheus::Counter& shared_decode_misses_;
  prometheus::Family<prometheus::Counter>& stream_errors_;
  prometheus::Family<prometheus::Counter>& download_failures_;
  prometheus::Family<prometheus::Counter>& bytes_served_;
  prometheus::Counter& bytes_same_node_;
  prometheus::Counter& bytes_other_node_;
  prometheus::Counter& bytes_unknown_node_;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_DATASERVER_METRICS_H_
