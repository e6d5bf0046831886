// Prometheus metrics of the coordinator (prometheus-cpp). Names follow
// Prometheus conventions: base units, `_total` counters, `_seconds`
// histograms; the labels are `sluice_job`, the job name (bounded by the
// number of jobs; not `job`, which Prometheus sets to the scrape job), and
// `source` for a mixed job's sources.
#ifndef SLUICE_SERVER_COORDINATOR_COORDINATOR_METRICS_H_
#define SLUICE_SERVER_COORDINATOR_COORDINATOR_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <string>
#include <vector>

namespace sluice {

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  // The per-job series, looked up once per job (Family::Add builds and
  // hashes a label map: too slow for every lease operation).
  struct Job {
    prometheus::Counter* granted;
    // Samples granted by where the unit is read, against the reader's node
    // (Hello.node): on its node, on another, or the reader named none.
    prometheus::Counter* granted_same_node;
    prometheus::Counter* granted_other_node;
    prometheus::Counter* granted_unknown_node;
    prometheus::Counter* completed;
    prometheus::Counter* expired;
    prometheus::Counter* released;
    prometheus::Counter* resumes;
    prometheus::Gauge* epoch_samples;
    prometheus::Gauge* epoch_completed;
    prometheus::Gauge* epoch;
    prometheus::Gauge* sessions;
    prometheus::Gauge* rank_skew;
    // Trainers' waits for their next sample (heartbeat InputWait).
    prometheus::Histogram* input_wait;
  };
  // The InputWait buckets' upper bounds (the protocol's; +Inf is implied).
  static const std::vector<double> kInputWaitBounds;
  // Not thread-safe: the coordinator calls it under its mutex.
  const Job& ForJob(const std::string& job);
  // A mixed job's source: its share and progress in the current epoch, and
  // the samples it has had consumed (a running total, exported as a
  // counter). Same locking as ForJob.
  void SetSource(const std::string& job, const std::string& source,
                 int64_t epoch_samples, int64_t epoch_consumed,
                 int64_t consumed_total);
  // Drops a deleted job's series (so its gauges do not linger at their last
  // values). Same locking as ForJob.
  void RemoveJob(const std::string& job);

  prometheus::Gauge& jobs;
  prometheus::Gauge& live_leases;
  prometheus::Histogram& fsync_latency;
  prometheus::Gauge& journal_bytes;
  prometheus::Counter& compactions;
  prometheus::Gauge& data_servers;
  // Registered, leaving (DataServerDraining), routed nothing new.
  prometheus::Gauge& draining_data_servers;
  // FleetSizer's answer, and the trainers' input-wait share it is based on.
  prometheus::Gauge& desired_data_servers;
  // The same for one data-server pool (label `pool`, "" = the default):
  // desired_data_servers is their sum. Pools are few (operators name them).
  prometheus::Gauge& PoolDesiredDataServers(const std::string& pool) {
    return pool_desired_.Add({{"pool", pool}});
  }
  // Drops a pool's series (a pool with no job and no server left).
  void RemovePool(const std::string& pool) {
    pool_desired_.Remove(&pool_desired_.Add({{"pool", pool}}));
  }
  prometheus::Gauge& input_wait_share;
  // From the trainer message that made a grant possible (Want, Complete,
  // Release ...) to the durable Grant handed to the stream.
  prometheus::Histogram& grant_latency;
  // 1 while this coordinator leads (always, with a local journal).
  prometheus::Gauge& is_leader;
  // Times this coordinator became the leader; summed over the coordinators
  // of one etcd prefix, the number of leader changes.
  prometheus::Counter& leader_changes;
  // Stalls of the coordinator itself that its expiry tick noticed.
  prometheus::Counter& stalls;
  // Duration of each etcd commit transaction (journal in etcd only).
  prometheus::Histogram& etcd_request_latency;
  // Callers waiting in a Barrier now, over every scope.
  prometheus::Gauge& barrier_waiting;
  // The coordinator's state lock: how long each taker waited for it, and
  // how long each held it (wall time), and the CPU time the holding thread
  // used meanwhile (the hold's own work, without preemption).
  prometheus::Histogram& lock_wait;
  prometheus::Histogram& lock_hold;
  prometheus::Histogram& lock_hold_cpu;
  // The CPU time under the lock spent handling a session message of the
  // kind whose TrainerMessage field number is `message_case`
  // (sluice_coordinator_message_lock_cpu_seconds_total{message}); nullptr
  // for an unknown kind.
  prometheus::Counter* message_lock_cpu(int message_case) const {
    return message_case > 0 &&
                   static_cast<size_t>(message_case) < message_lock_cpu_.size()
               ? message_lock_cpu_[static_cast<size_t>(message_case)]
               : nullptr;
  }

 private:
  std::vector<prometheus::Counter*> message_lock_cpu_;  // by field number
  prometheus::Family<prometheus::Counter>& granted_;
  prometheus::Family<prometheus::Counter>& granted_samples_;
  prometheus::Family<prometheus::Counter>& completed_;
  prometheus::Family<prometheus::Counter>& expired_;
  prometheus::Family<prometheus::Counter>& released_;
  prometheus::Family<prometheus::Gauge>& epoch_total_;
  prometheus::Family<prometheus::Gauge>& epoch_done_;
  prometheus::Family<prometheus::Gauge>& epoch_;
  prometheus::Family<prometheus::Counter>& resumes_;
  prometheus::Family<prometheus::Gauge>& sessions_;
  prometheus::Family<prometheus::Gauge>& rank_skew_;
  prometheus::Family<prometheus::Histogram>& input_wait_;
  prometheus::Family<prometheus::Gauge>& source_epoch_total_;
  prometheus::Family<prometheus::Gauge>& source_epoch_done_;
  prometheus::Family<prometheus::Counter>& source_consumed_;
  prometheus::Family<prometheus::Gauge>& pool_desired_;
  std::map<std::string, Job> jobs_;
  struct Source {
    prometheus::Gauge* epoch_samples;
    prometheus::Gauge* epoch_completed;
    prometheus::Counter* consumed;
    int64_t exported = 0;  // consumed_total already added to `consumed`
  };
  std::map<std::pair<std::string, std::string>, Source> sources_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_COORDINATOR_METRICS_H_
