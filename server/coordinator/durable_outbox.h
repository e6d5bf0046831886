// The coordinator's outbox: what a state change sends (messages to trainer
// sessions, prefetch hints to data servers, stream ends, the answers to
// unary calls such as CreateJob and GetJob and to a Once step's runner),
// held until the
// journal records it depends on are durable, then delivered in the order
// the changes were decided.
//
// No trainer hears of state a crash could lose (G5), and no gRPC thread
// waits for an fsync: a caller submits under the service's lock (so outbox
// order is journal order) and then delivers, on its own thread, only what is
// already durable (DeliverReady); the flusher thread waits for the journal's
// group commit and delivers the rest. Effects with no record of their own
// (a Synced, a Waiting) still wait for every record before them.
//
// Thread-safe.
#ifndef SLUICE_SERVER_COORDINATOR_DURABLE_OUTBOX_H_
#define SLUICE_SERVER_COORDINATOR_DURABLE_OUTBOX_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/coordinator/coordinator_metrics.h"
#include "server/coordinator/data_server_registry.h"
#include "server/coordinator/journal.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

// Where a session's outgoing messages go. Implementations queue and return
// at once; they never call back into the coordinator.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual void Send(v1::CoordinatorMessage message) = 0;
  // Ends the stream with `status` after the queued messages.
  virtual void Finish(const absl::Status& status) = 0;
};

// What one state change sends once `ticket` (its journal records, or 0 for
// none) is durable.
struct Effects {
  std::vector<std::pair<std::shared_ptr<SessionSink>, v1::CoordinatorMessage>>
      sends;
  std::vector<std::pair<std::shared_ptr<SessionSink>, absl::Status>> finishes;
  std::vector<
      std::pair<std::shared_ptr<DataServerSink>, v1::CoordinatorToDataServer>>
      hints;
  // Answers to unary calls (job create, get, delete ...): each is called
  // once, with OK when the records are durable, or UNAVAILABLE naming the
  // journal's failure.
  std::vector<std::function<void(const absl::Status&)>> replies;
  uint64_t ticket = 0;
  absl::Time started = absl::Now();  // for the grant latency histogram
};

class DurableOutbox {
 public:
  // `journal` must outlive the outbox; `metrics` may be null. Starts the
  // flusher thread.
  DurableOutbox(Journal* journal, CoordinatorMetrics* metrics);
  // Stops the flusher, then delivers what is left once durable.
  ~DurableOutbox();
  DurableOutbox(const DurableOutbox&) = delete;
  DurableOutbox& operator=(const DurableOutbox&) = delete;

  // Queues `fx` behind everything submitted before. Call in journal order
  // (under the lock the records were enqueued under). Effects with neither
  // records nor anything to send are dropped.
  void Submit(Effects fx);
  // Delivers, on the calling thread, the queued effects already durable
  // (none if another thread is delivering: it takes these too).
  void DeliverReady();
  // Waits until everything submitted has been handed to its sinks.
  void Flush();

 private:
  void RunFlusher();
  // Hands `fx` to its sinks; when `durable` failed, ends its sessions with
  // UNAVAILABLE instead of sending anything that depends on the lost write.
  void Send(Effects& fx, const absl::Status& durable);
  void UpdateJournalBytes();

  Journal* const journal_;
  CoordinatorMetrics* const metrics_;
  absl::Mutex mu_;
  std::deque<Effects> queue_ ABSL_GUARDED_BY(mu_);
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread flusher_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_DURABLE_OUTBOX_H_
