// Prometheus metrics of the coordinator (prometheus-cpp). Names follow
// Prometheus conventions: base units, `_total` counters, `_seconds`
// histograms; the only label is the job name (bounded by the number of jobs).
#ifndef SLUICE_SERVER_COORDINATOR_COORDINATOR_METRICS_H_
#define SLUICE_SERVER_COORDINATOR_COORDINATOR_METRICS_H_

#include <string>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace sluice {

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  prometheus::Counter& LeasesGranted(const std::string& job) { return granted_.Add({{"job", job}}); }
  prometheus::Counter& LeasesCompleted(const std::string& job) { return completed_.Add({{"job", job}}); }
  prometheus::Counter& LeasesExpired(const std::string& job) { return expired_.Add({{"job", job}}); }
  prometheus::Counter& LeasesReleased(const std::string& job) { return released_.Add({{"job", job}}); }
  prometheus::Gauge& EpochSamplesTotal(const std::string& job) { return epoch_total_.Add({{"job", job}}); }
  prometheus::Gauge& EpochSamplesCompleted(const std::string& job) { return epoch_done_.Add({{"job", job}}); }
  prometheus::Gauge& Epoch(const std::string& job) { return epoch_.Add({{"job", job}}); }
  prometheus::Counter& Resumes(const std::string& job) { return resumes_.Add({{"job", job}}); }

  prometheus::Gauge& jobs;
  prometheus::Gauge& sessions;
  prometheus::Gauge& live_leases;
  prometheus::Histogram& fsync_latency;
  prometheus::Gauge& journal_bytes;
  prometheus::Counter& compactions;
  prometheus::Gauge& data_servers;
  // From the trainer message that made a grant possible (Want, Complete,
  // Release ...) to the durable Grant handed to the stream.
  prometheus::Histogram& grant_latency;

 private:
  prometheus::Family<prometheus::Counter>& granted_;
  prometheus::Family<prometheus::Counter>& completed_;
  prometheus::Family<prometheus::Counter>& expired_;
  prometheus::Family<prometheus::Counter>& released_;
  prometheus::Family<prometheus::Gauge>& epoch_total_;
  prometheus::Family<prometheus::Gauge>& epoch_done_;
  prometheus::Family<prometheus::Gauge>& epoch_;
  prometheus::Family<prometheus::Counter>& resumes_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_COORDINATOR_METRICS_H_
