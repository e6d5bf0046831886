// The C++ Reader (sluice/reader.h) behind its facade, in reader.cc: Next,
// Cursor and Close; what the coordinator's messages do (grants, revokes,
// epochs, Syncs); reports, heartbeats and the maintenance thread. The
// Session stream itself is the CoordinatorSession's
// (coordinator_session.h), each held unit's ReadSamples stream the
// UnitFetcher's (unit_fetcher.h). The timing rules they apply are their own
// classes (report_ledger.h, lease_hold.h, fetch_turn.h, reroute_backoff.h,
// input_wait.h), tested on a fake clock.
#ifndef SLUICE_CLIENT_CPP_READER_IMPL_H_
#define SLUICE_CLIENT_CPP_READER_IMPL_H_

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/channel_credentials.h"
#include "client/cpp/completion_loop.h"
#include "client/cpp/coordinator_session.h"
#include "client/cpp/held_unit.h"
#include "client/cpp/input_wait.h"
#include "client/cpp/lease_hold.h"
#include "client/cpp/lost_deliveries.h"
#include "client/cpp/report_ledger.h"
#include "client/cpp/unit_fetcher.h"
#include "server/common/clock.h"
#include "server/common/grpc_target.h"
#include "server/common/node_name.h"
#include "server/common/work_unit.h"
#include "sluice/reader.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "sluice/v1/dataserver.grpc.pb.h"

namespace sluice::client_internal {

using v1::CoordinatorMessage;
using v1::TrainerMessage;

class ReaderImpl final : public Reader,
                         private FetchListener,
                         private SessionHandler {
 public:
  // `clock`: what the stall timeout and the timing rules read.
  explicit ReaderImpl(ReaderOptions options, const Clock* clock = Clock::Real())
      : options_(std::move(options)), clock_(clock) {
    if (options_.trainer_id.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      options_.trainer_id = absl::StrCat(host, "-", getpid(), "-r",
                                         options_.rank, "-w", options_.worker);
    }
    if (options_.node.empty()) options_.node = NodeName();
    if (options_.launch_id.empty()) {
      // A new launch: a resume from this Reader is a restart of its own.
      absl::BitGen bits;
      options_.launch_id = absl::StrCat(
          absl::Hex(absl::Uniform<uint64_t>(bits), absl::kZeroPad16),
          absl::Hex(absl::Uniform<uint64_t>(bits), absl::kZeroPad16));
    }
    if (options_.units_in_flight < 1) options_.units_in_flight = 1;
    credits_ = options_.units_in_flight;
    if (options_.buffer_samples < 1) options_.buffer_samples = 1;
  }

  ~ReaderImpl() override { Close(); }

  void Start() {
    loop_.Start();
    session_.Start();
    maintenance_thread_ = std::thread([this] { RunMaintenance(); });
  }

  absl::StatusOr<ReaderEvent> NextWithin(absl::Duration timeout) override;
  void Want(int32_t units) override;
  ReaderStats stats() const override {
    absl::MutexLock lock(&mu_);
    ReaderStats stats = stats_;
    stats.batches = fetcher_.batches();
    stats.reconnects = session_.reconnects();
    return stats;
  }
  void Close() override;
  absl::StatusOr<v1::Cursor> Cursor() override;

 private:
  struct Entry {
    ReaderEvent::Kind kind;
    int64_t epoch = 0, samples = 0, already = 0;
    std::shared_ptr<HeldUnit> unit;  // null for markers
    int64_t worker_samples = 0, worker_already = 0;
    std::string message;  // kDone
  };

  std::shared_ptr<grpc::ChannelCredentials> Creds() const {
    return client_internal::ChannelCredentials(options_.tls);
  }

  // FetchListener.
  void SamplesArrivedLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    data_cv_.Signal();
  }
  void FetchEndedLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    NotifyAllLocked();
  }
  void FailLocked(absl::Status status) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    fatal_ = std::move(status);
  }
  void TransportCheckQueuedLocked() override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    maintenance_cv_.Signal();
  }

  // Blocking writes on the session stream, one at a time.
  bool Send(const TrainerMessage& m) { return session_.Send(m); }
  // Sends Sync{id} with the next id; ids go out in increasing order, so a
  // Synced{n} confirms every Sync below n too. Returns 0 if not sent.
  uint64_t SendSync() {
    uint64_t id = 0;
    const bool sent = session_.Send([this, &id](TrainerMessage* sync) {
      absl::MutexLock state(&mu_);
      id = ledger_.NextSyncId();
      sync->mutable_sync()->set_id(id);
      hold_.SyncSent(id);
      if (v1::InputWait wait; input_wait_.Take(&wait)) {
        *sync->mutable_sync()->mutable_input_wait() = std::move(wait);
      }
    });
    return sent ? id : 0;
  }

  // SessionHandler.
  bool SessionWanted() override;
  absl::Duration LeaseTtl() override;
  void OpeningMessages(TrainerMessage* hello, TrainerMessage* want) override;
  void StreamOpen(bool open) override;
  void Welcomed(const CoordinatorMessage& welcome) override;
  void Received(const CoordinatorMessage& message) override { Handle(message); }
  void Failed(absl::Status status) override;

  void Handle(const CoordinatorMessage& m);
  void RunMaintenance();
  // Fails the reader when a data server whose stream failed speaks TLS and
  // this reader plaintext, or the reverse.
  void CheckDataServerTransports();
  // Sends final reports, and Progress for units with new deliveries when
  // `progress` is set.
  // `force`: a Progress for every live unit, even without new deliveries
  // (after a reconnect, so the coordinator confirms or rejects each lease).
  void FlushReports(bool progress, bool force = false);
  void DropLocked(HeldUnit& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    u.dropped = true;
    u.buffer.clear();
    fetcher_.CancelLocked(u);
    NotifyAllLocked();
  }
  // The lease is no longer ours (Revoke, Rejected): drop what is undelivered
  // and report nothing more for it; what it delivered counts as lost
  // deliveries (lost_deliveries.h).
  void RetireLocked(const std::string& lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Reported but not taken (the lease expired before the report came):
    // everything the report covered was delivered.
    if (std::optional<ReportLedger::Dropped> d = ledger_.Drop(lease_id))
      lost_.Lost(d->lease, d->delivered);
    auto it = units_.find(lease_id);
    if (it == units_.end()) return;
    lost_.Lost(it->second->lease, it->second->delivered);
    DropLocked(*it->second);
    it->second->final_report.reset();
    retired_.push_back(it->second);
    units_.erase(it);
  }
  // Retires every held lease of the same unit as `lease` (same epoch,
  // sequence and shard) under another lease id.
  void RetireSupersededLocked(const v1::Lease& lease)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> superseded;
    for (const auto& [id, u] : units_) {
      const v1::Lease& held = u->lease;
      if (id != lease.lease_id() && held.epoch() == lease.epoch() &&
          held.unit().sequence() == lease.unit().sequence() &&
          UnitIndex(held.unit()) == UnitIndex(lease.unit())) {
        superseded.push_back(id);
      }
    }
    for (const std::string& id : superseded) RetireLocked(id);
  }
  ReaderOptions options_;

  mutable absl::Mutex mu_;
  // Wait queues on mu_, so the per-batch hand-off wakes only the consumer
  // (data_cv_, Next); cv_ is for the session, Cursor and Close, and the
  // maintenance thread sleeps on its own timer. A state change off the hot
  // path wakes the first two and opens the streams whose turn has come
  // (NotifyAllLocked).
  absl::CondVar cv_;
  absl::CondVar data_cv_;
  absl::CondVar maintenance_cv_;  // the maintenance thread's timer; woken on
                                  // closing and for transport checks
  void NotifyAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    fetcher_.StartEligibleLocked();
    cv_.SignalAll();
    data_cv_.SignalAll();
    if (closing_) maintenance_cv_.Signal();
  }
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<HeldUnit>> units_ ABSL_GUARDED_BY(mu_);
  // Final reports not yet known to be durable, and the Sync ids.
  ReportLedger ledger_ ABSL_GUARDED_BY(mu_);
  const Clock* const clock_;
  // Whether delivery waits for the coordinator to confirm held leases.
  LeaseHold hold_ ABSL_GUARDED_BY(mu_){clock_};
  LostDeliveries lost_ ABSL_GUARDED_BY(mu_);
  // Units no longer in units_ whose stream may still have an operation
  // outstanding.
  std::vector<std::shared_ptr<HeldUnit>> retired_ ABSL_GUARDED_BY(mu_);
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool job_done_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_epoch_begin_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t last_epoch_end_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  int64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t world_size_ ABSL_GUARDED_BY(mu_) = 0;
  // The Want credits: units_in_flight, or what Want() set since.
  int32_t credits_ ABSL_GUARDED_BY(mu_) = 0;
  // A job with sources: their names as its leases named them ("" = not
  // seen yet), for cursors.
  std::vector<std::string> source_names_ ABSL_GUARDED_BY(mu_);
  bool resume_done_ ABSL_GUARDED_BY(mu_) =
      false;  // the cursor reached a Welcome
  bool stream_open_ ABSL_GUARDED_BY(mu_) = false;
  // Consumer-side position (the thread calling Next()).
  int64_t position_epoch_ = -1;
  int64_t position_consumed_ = 0;
  // Whether Next() has been waiting for an event, and since when.
  bool waiting_ = false;
  absl::Time waiting_since_;
  // One flush at a time, so reports of one lease never overtake each other.
  absl::Mutex flush_mu_;
  ReaderStats stats_ ABSL_GUARDED_BY(mu_);

  // The consumer's waits for samples since the last heartbeat.
  InputWaitHistogram input_wait_ ABSL_GUARDED_BY(mu_);

  // Every stream's operations complete here, on its one I/O thread.
  CompletionLoop loop_;
  // Each held unit's ReadSamples stream.
  UnitFetcher fetcher_ ABSL_GUARDED_BY(mu_){options_, &mu_,   &units_,
                                            &loop_,   clock_, this};
  // The Session stream to the coordinator.
  CoordinatorSession session_{options_, &loop_, clock_, this};
  std::thread maintenance_thread_;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_READER_IMPL_H_
