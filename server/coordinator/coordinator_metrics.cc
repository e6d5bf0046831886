#include "server/coordinator/coordinator_metrics.h"

#include <google/protobuf/descriptor.h>

#include "sluice/v1/coordinator.pb.h"

namespace sluice {
namespace {

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& r,
                                                       const char* name,
                                                       const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}
prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& r,
                                                   const char* name,
                                                   const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

}  // namespace

const std::vector<double> CoordinatorMetrics::kInputWaitBounds = {
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10};

namespace {
// 1 us to 1 s: a grant holds the lock for tens of microseconds.
prometheus::Histogram::BucketBoundaries LockBounds() {
  return {0.000001, 0.00001, 0.0001, 0.00025, 0.0005,
          0.001,    0.0025,  0.01,   0.1,     1};
}
}  // namespace

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& r)
    : jobs(GaugeFamily(r, "sluice_coordinator_jobs",
                       "Jobs known to the coordinator.")
               .Add({})),
      live_leases(GaugeFamily(r, "sluice_coordinator_live_leases",
                              "Leases currently held.")
                      .Add({})),
      fsync_latency(
          prometheus::BuildHistogram()
              .Name("sluice_coordinator_journal_fsync_seconds")
              .Help("Duration of each journal fsync (one per group commit).")
              .Register(r)
              .Add({},
                   prometheus::Histogram::BucketBoundaries{
                       0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                       0.025, 0.05, 0.1, 0.25, 1})),
      journal_bytes(GaugeFamily(r, "sluice_coordinator_journal_bytes",
                                "Size of the journal file in bytes.")
                        .Add({})),
      compactions(
          CounterFamily(
              r, "sluice_coordinator_journal_compactions_total",
              "Journal compactions (the journal replaced by one snapshot).")
              .Add({})),
      data_servers(GaugeFamily(r, "sluice_coordinator_data_servers",
                               "Data servers registered and heartbeating.")
                       .Add({})),
      draining_data_servers(
          GaugeFamily(r, "sluice_coordinator_draining_data_servers",
                      "Data servers leaving: registered, finishing or "
                      "handing back their streams, routed no new unit.")
              .Add({})),
      desired_data_servers(
          GaugeFamily(r, "sluice_coordinator_desired_data_servers",
                      "The data servers the jobs need: from the trainers' "
                      "input-wait share and consumption and the servers' "
                      "measured capacity (FleetSizer); what an autoscaler "
                      "follows.")
              .Add({})),
      input_wait_share(
          GaugeFamily(r, "sluice_coordinator_input_wait_share",
                      "Share of the trainers' time spent waiting for input, "
                      "over FleetSizer's window (all jobs).")
              .Add({})),
      grant_latency(
          prometheus::BuildHistogram()
              .Name("sluice_coordinator_lease_grant_latency_seconds")
              .Help(
                  "From the trainer message that freed a credit to the durable "
                  "Grant being sent.")
              .Register(r)
              .Add({},
                   prometheus::Histogram::BucketBoundaries{
                       0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                       0.025, 0.05, 0.1, 0.25, 1})),
      is_leader(GaugeFamily(r, "sluice_coordinator_is_leader",
                            "1 while this coordinator leads and serves; 0 "
                            "while it waits as a standby (etcd journal).")
                    .Add({})),
      leader_changes(
          CounterFamily(r, "sluice_coordinator_leader_changes_total",
                        "Times this coordinator became the leader; summed "
                        "over the coordinators of one etcd prefix, the "
                        "number of leader changes.")
              .Add({})),
      stalls(CounterFamily(r, "sluice_coordinator_stalls_total",
                           "Times the coordinator found it had not run for "
                           "longer than its stall bound (SIGSTOP, a VM or "
                           "swap stall) and gave every live lease a fresh "
                           "TTL before expiring any.")
                 .Add({})),
      etcd_request_latency(
          prometheus::BuildHistogram()
              .Name("sluice_coordinator_etcd_request_seconds")
              .Help("Duration of each etcd transaction committing the "
                    "journal (etcd journal only).")
              .Register(r)
              .Add({},
                   prometheus::Histogram::BucketBoundaries{
                       0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                       0.25, 0.5, 1, 2.5})),
      barrier_waiting(GaugeFamily(r, "sluice_coordinator_barrier_waiting",
                                  "Callers waiting in a Barrier now (every "
                                  "scope); a caller that leaves stops "
                                  "counting.")
                          .Add({})),
      lock_wait(prometheus::BuildHistogram()
                    .Name("sluice_coordinator_lock_wait_seconds")
                    .Help("How long each call waited for the coordinator's "
                          "state lock.")
                    .Register(r)
                    .Add({}, LockBounds())),
      lock_hold(prometheus::BuildHistogram()
                    .Name("sluice_coordinator_lock_hold_seconds")
                    .Help("How long each call held the coordinator's state "
                          "lock (a grant, a Hello, an expiry tick, a "
                          "registration...).")
                    .Register(r)
                    .Add({}, LockBounds())),
      lock_hold_cpu(prometheus::BuildHistogram()
                        .Name("sluice_coordinator_lock_hold_cpu_seconds")
                        .Help("CPU time the holding thread used while it "
                              "held the coordinator's state lock: the "
                              "work done under it, without the time the "
                              "thread was descheduled.")
                        .Register(r)
                        .Add({}, LockBounds())),
      granted_(CounterFamily(r, "sluice_coordinator_leases_granted_total",
                             "Leases granted.")),
      granted_samples_(CounterFamily(
          r, "sluice_coordinator_granted_samples_total",
          "Samples granted, by where they are read against the reader's "
          "node (locality: same_node, other_node; unknown when the reader "
          "named no node).")),
      completed_(CounterFamily(r, "sluice_coordinator_leases_completed_total",
                               "Leases completed by their holder.")),
      expired_(CounterFamily(
          r, "sluice_coordinator_leases_expired_total",
          "Leases reclaimed after their TTL (holder presumed dead).")),
      released_(
          CounterFamily(r, "sluice_coordinator_leases_revoked_total",
                        "Leases given back or re-routed before completion.")),
      epoch_total_(GaugeFamily(r, "sluice_coordinator_epoch_samples",
                               "Samples served per epoch (after drop/pad).")),
      epoch_done_(GaugeFamily(r, "sluice_coordinator_epoch_samples_completed",
                              "Samples of the current epoch acknowledged.")),
      epoch_(GaugeFamily(r, "sluice_coordinator_epoch",
                         "Current epoch of the job.")),
      resumes_(
          CounterFamily(r, "sluice_coordinator_resumes_total",
                        "Job positions moved to a trainer's resume cursor.")),
      sessions_(
          GaugeFamily(r, "sluice_coordinator_sessions",
                      "Open trainer sessions of the job (past their Hello).")),
      rank_skew_(GaugeFamily(
          r, "sluice_coordinator_rank_skew_samples",
          "Samples of the current epoch the most advanced rank has consumed "
          "beyond the least advanced one (jobs with a world size). A value "
          "that keeps growing is a straggling rank.")),
      input_wait_(prometheus::BuildHistogram()
                      .Name("sluice_trainer_input_wait_seconds")
                      .Help("Time a reader's consumer (training loop or "
                            "DataLoader worker) waited for each sample it "
                            "took: 0 when one was buffered. Reported by the "
                            "trainers in their session heartbeats.")
                      .Register(r)),
      source_epoch_total_(GaugeFamily(
          r, "sluice_coordinator_source_epoch_samples",
          "Samples a mixed job's source contributes to the current epoch.")),
      source_epoch_done_(GaugeFamily(
          r, "sluice_coordinator_source_epoch_samples_completed",
          "Samples of a mixed job's source acknowledged in the current "
          "epoch.")),
      source_consumed_(CounterFamily(
          r, "sluice_coordinator_source_samples_consumed_total",
          "Samples of a mixed job's source acknowledged, over all epochs "
          "(since this coordinator started leading).")),
      pool_desired_(GaugeFamily(
          r, "sluice_coordinator_pool_desired_data_servers",
          "The data servers one pool's jobs need (label pool; \"\" = the "
          "default pool): what the autoscaler of that pool's data servers "
          "follows. sluice_coordinator_desired_data_servers is their sum.")) {
  auto& by_message = CounterFamily(
      r, "sluice_coordinator_message_lock_cpu_seconds_total",
      "CPU time spent under the coordinator's state lock handling session "
      "messages, by the message's kind (hello, want, progress, complete, "
      "heartbeat...).");
  const google::protobuf::OneofDescriptor* kinds =
      v1::TrainerMessage::descriptor()->FindOneofByName("msg");
  for (int i = 0; kinds != nullptr && i < kinds->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* kind = kinds->field(i);
    const auto number = static_cast<size_t>(kind->number());
    if (message_lock_cpu_.size() <= number)
      message_lock_cpu_.resize(number + 1, nullptr);
    message_lock_cpu_[number] = &by_message.Add({{"message", kind->name()}});
  }
}

void CoordinatorMetrics::SetSource(const std::string& job,
                                   const std::string& source,
                                   int64_t epoch_samples,
                                   int64_t epoch_consumed,
                                   int64_t consumed_total) {
  auto key = std::make_pair(job, source);
  auto it = sources_.find(key);
  if (it == sources_.end()) {
    const prometheus::Labels labels = {{"sluice_job", job}, {"source", source}};
    Source series{&source_epoch_total_.Add(labels),
                  &source_epoch_done_.Add(labels),
                  &source_consumed_.Add(labels), 0};
    it = sources_.emplace(std::move(key), series).first;
  }
  Source& s = it->second;
  s.epoch_samples->Set(static_cast<double>(epoch_samples));
  s.epoch_completed->Set(static_cast<double>(epoch_consumed));
  if (consumed_total > s.exported) {
    s.consumed->Increment(static_cast<double>(consumed_total - s.exported));
    s.exported = consumed_total;
  }
}

const CoordinatorMetrics::Job& CoordinatorMetrics::ForJob(
    const std::string& job) {
  auto it = jobs_.find(job);
  if (it != jobs_.end()) return it->second;
  // Not "job": Prometheus attaches its own job label to every scraped series.
  const prometheus::Labels labels = {{"sluice_job", job}};
  auto locality = [&](const char* where) {
    return &granted_samples_.Add({{"sluice_job", job}, {"locality", where}});
  };
  Job series{
      &granted_.Add(labels),     locality("same_node"),
      locality("other_node"),    locality("unknown"),
      &completed_.Add(labels),   &expired_.Add(labels),
      &released_.Add(labels),    &resumes_.Add(labels),
      &epoch_total_.Add(labels), &epoch_done_.Add(labels),
      &epoch_.Add(labels),       &sessions_.Add(labels),
      &rank_skew_.Add(labels),   &input_wait_.Add(labels, kInputWaitBounds)};
  return jobs_.emplace(job, series).first->second;
}

void CoordinatorMetrics::RemoveJob(const std::string& job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  const Job& s = it->second;
  granted_.Remove(s.granted);
  granted_samples_.Remove(s.granted_same_node);
  granted_samples_.Remove(s.granted_other_node);
  granted_samples_.Remove(s.granted_unknown_node);
  completed_.Remove(s.completed);
  expired_.Remove(s.expired);
  released_.Remove(s.released);
  resumes_.Remove(s.resumes);
  epoch_total_.Remove(s.epoch_samples);
  epoch_done_.Remove(s.epoch_completed);
  epoch_.Remove(s.epoch);
  sessions_.Remove(s.sessions);
  rank_skew_.Remove(s.rank_skew);
  input_wait_.Remove(s.input_wait);
  jobs_.erase(it);
  for (auto src = sources_.begin(); src != sources_.end();) {
    if (src->first.first != job) {
      ++src;
      continue;
    }
    source_epoch_total_.Remove(src->second.epoch_samples);
    source_epoch_done_.Remove(src->second.epoch_completed);
    source_consumed_.Remove(src->second.consumed);
    src = sources_.erase(src);
  }
}

}  // namespace sluice
