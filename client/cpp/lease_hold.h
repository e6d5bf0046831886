// When a Reader must hold back samples it has already fetched.
//
// A coordinator that has not heard from a trainer for a lease TTL expires
// its leases and grants them to others. After the session has been down for
// more than half a TTL, the Reader therefore delivers nothing until the
// coordinator has answered for every held lease: on reconnecting it reports
// every lease's position and sends a Sync; a lease the coordinator no longer
// knows is Rejected before the Synced, and its rest is dropped. Half a TTL
// leaves the other half for the reconnect itself; a shorter break delivers
// on without waiting.
//
// Times come from the injected Clock. Not thread-safe: the Reader guards it
// with its state mutex.
#ifndef SLUICE_CLIENT_CPP_LEASE_HOLD_H_
#define SLUICE_CLIENT_CPP_LEASE_HOLD_H_

#include <cstdint>

#include "absl/time/time.h"
#include "server/common/clock.h"

namespace sluice::client_internal {

class LeaseHold {
 public:
  explicit LeaseHold(const Clock* clock) : clock_(clock) {}

  // The coordinator's lease TTL (its Welcome).
  void set_lease_ttl(absl::Duration ttl) { lease_ttl_ = ttl; }
  absl::Duration lease_ttl() const { return lease_ttl_; }

  // The session stream broke (a second call while down changes nothing).
  void Disconnected();
  // Welcomed again; `sync_id` is the Sync sent after re-reporting every
  // held lease, 0 if it could not be sent (the stream broke again).
  void Reconnected(uint64_t sync_id);
  // Synced{id} arrived.
  void Synced(uint64_t id);

  // Down for over half a TTL, or back after that and not yet confirmed:
  // the held leases may have gone to another trainer.
  bool MayHaveLostLeases() const;

 private:
  bool DownTooLong() const;

  const Clock* const clock_;
  absl::Duration lease_ttl_ = absl::Seconds(10);
  absl::Time disconnected_at_ = absl::InfinitePast();  // while connected
  bool revalidating_ = false;
  uint64_t revalidate_id_ = 0;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_LEASE_HOLD_H_
