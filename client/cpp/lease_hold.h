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
// A stream can also go silent without breaking: the trainer itself paused
// (SIGSTOP, a GC or VM stall) or the coordinator paused or cut off. So the
// Reader also holds, by its own clock, once more than 3/4 of a TTL has passed
// since the newest renewal the coordinator confirmed: a Sync sent while
// leases are held (each heartbeat) renews them when the coordinator reads
// it, no earlier than it was sent, and its Synced confirms that. A lease the
// coordinator expired meanwhile is Revoked before that Synced. The margin of
// 1/4 TTL covers the delivery in progress and clocks whose rates differ by
// less than a quarter (the Chubby and etcd clients' rule).
//
// Times come from the injected Clock. Not thread-safe: the Reader guards it
// with its state mutex.
#ifndef SLUICE_CLIENT_CPP_LEASE_HOLD_H_
#define SLUICE_CLIENT_CPP_LEASE_HOLD_H_

#include <cstdint>
#include <map>

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
  // A Hello is about to be sent; Welcomed() when its Welcome arrives (the
  // Hello renewed every lease of the trainer).
  void HelloSent();
  void Welcomed();
  // Sync{id} is about to be sent.
  void SyncSent(uint64_t id);

  // Down for over half a TTL, or back after that and not yet confirmed, or
  // no renewal confirmed for over 3/4 of a TTL: the held leases may have
  // gone to another trainer.
  bool MayHaveLostLeases() const;

 private:
  bool DownTooLong() const;
  bool Silent() const;

  const Clock* const clock_;
  absl::Duration lease_ttl_ = absl::Seconds(10);
  absl::Time disconnected_at_ = absl::InfinitePast();  // while connected
  bool revalidating_ = false;
  uint64_t revalidate_id_ = 0;
  // When the newest confirmed renewal was sent (InfinitePast: none yet).
  absl::Time confirmed_at_ = absl::InfinitePast();
  absl::Time hello_sent_at_ = absl::InfinitePast();
  // Syncs sent and not yet confirmed, by id, with their send times.
  std::map<uint64_t, absl::Time> syncs_sent_;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_LEASE_HOLD_H_
