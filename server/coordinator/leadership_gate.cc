#include "server/coordinator/leadership_gate.h"

#include "absl/strings/str_cat.h"
#include "server/common/status_details.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice {

void LeadershipGate::SetLeader(const std::string& leader) {
  absl::MutexLock lock(&mu_);
  leader_ = leader;
}

void LeadershipGate::Lead(CoordinatorService* service) {
  leading_.store(service);
}

absl::Status LeadershipGate::NotLeaderStatus() const {
  v1::NotLeader details;
  {
    absl::MutexLock lock(&mu_);
    details.set_leader(leader_);
  }
  const std::string message =
      details.leader().empty()
          ? std::string(
                "standby coordinator: no coordinator leads at the moment; "
                "retry")
          : absl::StrCat("standby coordinator: ", details.leader(),
                         " leads; call it");
  return StatusWithDetail(absl::StatusCode::kUnavailable, message, details);
}

}  // namespace sluice
