// Once and Barrier from C++: the coordinator-backed replacements for "rank 0
// runs it, the others wait_for(path.exists())" and for lock files.
//
//   sluice::OnceOptions o{.coordinator = "head:7070", .name = "prepare-cifar"};
//   auto outcome = sluice::RunOnce(o, [] () -> absl::StatusOr<std::string> {
//     Download(); return std::string("/data/cifar");      // the shared result
//   });
//   // Exactly one caller ran the lambda; every caller gets outcome->result.
//
//   sluice::BarrierOptions b{.coordinator = "head:7070", .name = "ckpt-dir",
//                            .participant = "rank-3", .participants = 8};
//   auto arrived = sluice::WaitBarrier(b);  // DEADLINE_EXCEEDED names who is
//   missing
//
// Both are blocking calls, safe from any thread.
#ifndef SLUICE_CLIENT_INCLUDE_SLUICE_COORDINATION_H_
#define SLUICE_CLIENT_INCLUDE_SLUICE_COORDINATION_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sluice/tls.h"
#include "sluice/v1/coordinator.pb.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace sluice {

// Ends a RunOnce in progress from another thread (say, on Ctrl-C): its
// wait stops and RunOnce returns CANCELLED. A step already running is not
// interrupted. Give it to one RunOnce at a time through
// OnceOptions::cancel; it must outlive that call.
class OnceCancel {
 public:
  void Cancel();

  // For RunOnce: the call to cancel while it runs (null when it ends).
  // Returns false if Cancel() came first.
  bool Attach(grpc::ClientContext* call);

 private:
  absl::Mutex mu_;
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

struct OnceOptions {
  std::string coordinator;
  std::string scope = "default";  // e.g. the job name
  std::string name;
  std::string participant;  // default host-pid
  // The runner's execution lease: without a heartbeat for this long, a
  // waiter takes over.
  absl::Duration ttl = absl::Seconds(10);
  bool fail_all = false;  // a failed run fails every later caller too
  // TLS (sluice/tls.h), or none for plaintext (a coordinator that speaks
  // the other is named in a FAILED_PRECONDITION).
  std::optional<ClientTls> tls;
  // Called when this caller starts waiting (for logs).
  std::function<void(const std::string& runner, int64_t run)> on_wait;
  // Called when this caller is chosen, just before `step` runs.
  std::function<void(int64_t run)> on_run;
  // Gives up (DEADLINE_EXCEEDED) after this long, waiting included.
  absl::Duration timeout = absl::InfiniteDuration();
  // Optional: lets another thread end the call (see OnceCancel).
  OnceCancel* cancel = nullptr;
};

struct OnceOutcome {
  bool ran = false;  // this caller ran the step
  int64_t run = 0;
  std::string result;   // the runner's result string
  bool failed = false;  // the run failed; `error` says how
  std::string error;
};

// Joins (scope, name). If chosen, runs `step` while heartbeating, and
// reports its result or error. Returns what happened; an error status only
// for transport or protocol problems (e.g. the coordinator unreachable).
absl::StatusOr<OnceOutcome> RunOnce(
    const OnceOptions& options,
    const std::function<absl::StatusOr<std::string>()>& step);

struct BarrierOptions {
  std::string coordinator;
  std::string scope = "default";
  std::string name;
  std::string participant;
  int32_t participants = 0;
  absl::Duration timeout = absl::Minutes(1);
  // TLS (sluice/tls.h), or none for plaintext.
  std::optional<ClientTls> tls;
};

// Waits until `participants` distinct ids arrived. DEADLINE_EXCEEDED lists
// the ids that arrived and the missing ones.
absl::StatusOr<v1::BarrierResponse> WaitBarrier(const BarrierOptions& options);

}  // namespace sluice

#endif  // SLUICE_CLIENT_INCLUDE_SLUICE_COORDINATION_H_
