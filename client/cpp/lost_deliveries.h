// Samples a Reader delivered from a lease it then lost.
//
// A trainer paused past its lease TTL (SIGSTOP, a GC or VM stall) may have
// handed samples to the training loop that its Progress had not yet
// reported when the coordinator expired the lease. The coordinator
// re-grants the unreported rest of the unit to the same reader slot while
// that slot's session is open, so it comes back to this Reader: it starts
// with samples the loop already has. The Reader remembers what it delivered of
// every lease it lost (Revoke, Rejected) and, when a later grant of the same
// unit in the same epoch starts inside that range, reports those samples as
// consumed at once and fetches only the rest. A remainder granted to
// another reader (after this one's session ended) cannot be caught here.
//
// Not thread-safe: the Reader guards it with its state mutex.
#ifndef SLUICE_CLIENT_CPP_LOST_DELIVERIES_H_
#define SLUICE_CLIENT_CPP_LOST_DELIVERIES_H_

#include <cstdint>
#include <map>
#include <tuple>

#include "sluice/v1/common.pb.h"

namespace sluice::client_internal {

class LostDeliveries {
 public:
  // `lease` was lost after `delivered` of its samples were handed out.
  void Lost(const v1::Lease& lease, int64_t delivered);
  // How many samples at the start of `lease` were already delivered from a
  // lost lease of the same unit (0 if none); the rest of the range is kept
  // for a later grant.
  int64_t AlreadyDelivered(const v1::Lease& lease);
  // Forgets ranges of epochs before `epoch`.
  void ForgetBefore(int64_t epoch);
  bool empty() const { return ranges_.empty(); }

 private:
  // (epoch, unit sequence, UnitIndex) -> [begin, end) delivered.
  std::map<std::tuple<int64_t, int64_t, int32_t>, std::pair<int64_t, int64_t>>
      ranges_;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_LOST_DELIVERIES_H_
