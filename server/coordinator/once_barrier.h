// Once and Barrier: the coordinator primitives that replace "rank 0 does it,
// the others wait_for(path.exists())" and lock files.
//
// Once(scope, name): every participant joins over a stream; exactly one gets
// Run{run} and holds an execution lease renewed by its stream's messages
// (heartbeats); the others get Wait. Success is journaled (through
// `persist`) before anyone hears Done, so a coordinator restart never re-runs
// a finished step; every waiter and every later caller gets Done{result}. If
// the runner's stream breaks or its lease expires (ttl without a message),
// the next waiter gets Run{run + 1}; a Succeeded/Failed naming an old run is
// refused with ABORTED. A failure goes to every current waiter; under RETRY
// the next caller starts a new run, under FAIL_ALL the failure is journaled
// and every later caller gets it too.
//
// Barrier(scope, name, participants, timeout): returns when `participants`
// distinct ids have arrived; the name is then reused by the next generation.
// When the first caller's timeout passes, the generation fails as a whole:
// every caller waiting in it gets DEADLINE_EXCEEDED listing who arrived and
// who is missing (when ids look like "rank-3", by name), and the name moves
// to the next generation, so a late arrival waits for a full set again
// instead of passing alone. A caller whose call ends before the barrier
// passes (its process died, it gave up) is withdrawn: its id stops counting
// as arrived unless another call with the same id still waits, so a rank
// killed inside a barrier cannot let a restarted run's ranks through one at a
// time.
//
// Thread-safe. Callbacks and sink calls happen outside the lock, and so does
// `persist`, which answers once the journal has the outcome (its fsync or
// etcd), on whichever thread that is: no stream's thread waits for it.
// Meanwhile the step takes no new run, and callers joining it wait for its
// outcome.
#ifndef SLUICE_SERVER_COORDINATOR_ONCE_BARRIER_H_
#define SLUICE_SERVER_COORDINATOR_ONCE_BARRIER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/common/clock.h"
#include "sluice/v1/coordinator.pb.h"
#include "sluice/v1/journal.pb.h"

namespace sluice {

class OnceSink {
 public:
  virtual ~OnceSink() = default;
  virtual void Send(const v1::OnceResponse& response) = 0;
  // Ends the stream; at most once.
  virtual void Finish(const absl::Status& status) = 0;
};

// Limits on what one request can make the coordinator hold (INVALID_ARGUMENT
// naming the field and the limit beyond them).
inline constexpr size_t kMaxKeyBytes = 256;  // scope, name, participant
inline constexpr int32_t kMaxBarrierParticipants = 100000;
inline constexpr size_t kMaxOnceResultBytes = 64
                                              << 10;  // as OnceSucceeded says
inline constexpr size_t kMaxOnceErrorBytes = 64 << 10;
// Missing participants listed in a barrier timeout (the count is exact).
inline constexpr int kMaxListedMissing = 1000;

class OnceBarrier {
 public:
  struct Options {
    Clock* clock = Clock::Real();
    absl::Duration heartbeat_interval = absl::Seconds(1);
    absl::Duration default_ttl = absl::Seconds(10);
    absl::Duration default_barrier_timeout = absl::Minutes(10);
    // Journals a finished step and calls `done` once it is durable, or with
    // the error that kept it from being journaled (from any thread, perhaps
    // before returning; never with a lock of the caller's held). Done is
    // sent only after an OK. The OnceBarrier outlives every `done`.
    std::function<void(const v1::internal::OnceFinished&,
                       std::function<void(const absl::Status&)> done)>
        persist;
    // A step finished before (from the journal), if any.
    std::function<std::optional<v1::internal::OnceFinished>(
        const std::string& scope, const std::string& name)>
        find_finished;
    int32_t max_barrier_participants = kMaxBarrierParticipants;
    // Told the number of waiting Barrier callers whenever it changes
    // (under the lock; keep it cheap).
    std::function<void(size_t)> on_barrier_waiting;
  };
  explicit OnceBarrier(Options options) : options_(std::move(options)) {}

  int64_t OpenOnce(std::shared_ptr<OnceSink> sink);
  void OnOnceMessage(int64_t stream, const v1::OnceRequest& request);
  void CloseOnce(int64_t stream);

  using BarrierDone = std::function<void(absl::StatusOr<v1::BarrierResponse>)>;
  // Returns the waiter's id for CancelBarrier, or 0 when `done` already ran.
  int64_t Barrier(const v1::BarrierRequest& request, BarrierDone done);
  // The caller `waiter` is gone: it leaves its generation and hears
  // CANCELLED. A no-op once its `done` ran.
  void CancelBarrier(int64_t waiter);

  // Steps that have a runner or callers waiting now, of `scope` ("" =
  // every scope), as STATE_RUNNING OnceSteps ordered by scope and name.
  std::vector<v1::OnceStep> Running(const std::string& scope);

  // Expires runner leases and barrier deadlines; call periodically.
  void Tick();
  // Ends every Once stream and pending Barrier with UNAVAILABLE.
  void Drain();

 private:
  struct Stream {
    std::shared_ptr<OnceSink> sink;
    std::string key, scope, name, participant;
    absl::Duration ttl;
    v1::OnceFailurePolicy policy = v1::ONCE_FAILURE_POLICY_RETRY;
    bool joined = false;
    bool finished = false;
  };
  struct OnceEntry {
    int64_t run = 0;
    int64_t runner = 0;  // stream id; 0 = none
    absl::Time runner_deadline;
    std::deque<int64_t> waiters;
    // The run's outcome is being journaled (persist runs without mu_): no
    // new run starts and the runner's lease does not expire meanwhile.
    bool persisting = false;
  };
  // An outcome to journal once mu_ is released, then to announce.
  struct Outcome {
    int64_t stream = 0;
    std::string key;
    v1::internal::OnceFinished finished;
    v1::OnceResponse to_all;
    bool failed = false;
  };
  struct Pending {
    int64_t id = 0;
    std::string participant;
    absl::Time deadline;
    absl::Duration timeout;
    BarrierDone done;
  };
  struct BarrierEntry {
    int64_t generation = 0;
    int32_t participants = 0;
    std::vector<std::string> arrived;
    std::vector<Pending> pending;
  };
  struct Effects {
    std::vector<std::pair<std::shared_ptr<OnceSink>, v1::OnceResponse>> sends;
    std::vector<std::pair<std::shared_ptr<OnceSink>, absl::Status>> finishes;
    std::vector<std::pair<BarrierDone, absl::StatusOr<v1::BarrierResponse>>>
        barriers;
    void Run();
  };

  void FinishLocked(int64_t id, const absl::Status& status, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartRunLocked(OnceEntry& entry, int64_t id, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The runner is gone: hand the run to the next live waiter.
  void PromoteLocked(const std::string& key, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndStepLocked(const std::string& key, const v1::OnceResponse& to_all,
                     Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReportWaitingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Announces a journaled (or failed to journal) outcome.
  void FinishOutcomeLocked(const Outcome& outcome,
                           const absl::Status& persisted, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BarrierTimeoutStatus(const std::string& key,
                                    const BarrierEntry& entry,
                                    const Pending& pending) const;

  const Options options_;
  absl::Mutex mu_;
  int64_t next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, Stream> streams_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, OnceEntry> once_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, BarrierEntry> barriers_ ABSL_GUARDED_BY(mu_);
  int64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  // Waiting barrier callers: id -> barrier key.
  std::map<int64_t, std::string> waiters_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_ONCE_BARRIER_H_
