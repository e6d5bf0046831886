// LeadershipGate: whether this coordinator serves calls, and what a caller
// is told while it does not.
//
// A coordinator whose journal is in etcd listens from the start, so that
// clients given every coordinator's address can tell the leader from a
// standby. Until it leads, the gate has no service, and every call is
// refused with UNAVAILABLE whose message and NotLeader details name the
// leader (when one is known); once it leads (Lead), calls reach the service.
// A coordinator with a local journal leads from the start.
//
// Thread-safe: SetLeader and Lead may be called from any thread while calls
// ask for leading().
#ifndef SLUICE_SERVER_COORDINATOR_LEADERSHIP_GATE_H_
#define SLUICE_SERVER_COORDINATOR_LEADERSHIP_GATE_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace sluice {

class CoordinatorService;

class LeadershipGate {
 public:
  // Standing by: leading() is null until Lead.
  LeadershipGate() = default;
  // Leading `service` from the start.
  explicit LeadershipGate(CoordinatorService* service) : leading_(service) {}

  // While standing by: the leader's advertised address ("" = none known).
  void SetLeader(const std::string& leader);
  // From now on calls go to `service` (not owned; outlives the gate's use).
  void Lead(CoordinatorService* service);
  // The service calls go to, or null while standing by.
  CoordinatorService* leading() const { return leading_.load(); }

  // The UNAVAILABLE a standby answers with (NotLeader details).
  absl::Status NotLeaderStatus() const;

 private:
  std::atomic<CoordinatorService*> leading_{nullptr};
  mutable absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_LEADERSHIP_GATE_H_
