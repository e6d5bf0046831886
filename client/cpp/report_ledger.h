// The final reports of a Reader's leases (Complete, Reroute, Release) until
// the coordinator has made them durable.
//
// A final goes out on the session stream and may be lost with it: the
// coordinator's Synced{n} answers a Sync{n} sent after the report, and only
// then is the report known to be committed. Until then it is re-sent after
// every reconnect, in grant order (the order a resume cursor counts in),
// and a grant the coordinator re-announces for a lease already reported
// gets the report again instead of a second delivery.
//
// A report the coordinator did not take (its lease expired first: a paused
// reader) leaves samples delivered that the coordinator will grant again:
// Drop and DropSameUnit hand back what each such report had delivered, for
// LostDeliveries, and forget it.
//
// Sync ids increase, so Synced{n} confirms every Sync below n and every
// report sent before them.
//
// Not thread-safe: the Reader guards it with its state mutex.
#ifndef SLUICE_CLIENT_CPP_REPORT_LEDGER_H_
#define SLUICE_CLIENT_CPP_REPORT_LEDGER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sluice/v1/coordinator.pb.h"

namespace sluice::client_internal {

class ReportLedger {
 public:
  // The id of the next Sync to send.
  uint64_t NextSyncId() { return ++last_sync_id_; }
  // The highest Sync id handed out so far (0 before the first).
  uint64_t last_sync_id() const { return last_sync_id_; }

  // `message` (the final report of `lease`, which had delivered `delivered`
  // samples of its unit) was written after every Sync up to last_sync_id();
  // `order` is the lease's grant order.
  void Sent(const v1::Lease& lease, int64_t delivered,
            const v1::TrainerMessage& message, int64_t order);

  // Synced{id} arrived: the reports sent before Sync{id} are durable.
  void Synced(uint64_t id);
  // The highest Synced id seen.
  uint64_t synced() const { return synced_; }

  // Reports not yet confirmed, in grant order.
  std::vector<v1::TrainerMessage> Unconfirmed() const;
  // The unconfirmed report of `lease_id`, or null.
  const v1::TrainerMessage* Find(const std::string& lease_id) const;
  bool empty() const { return reports_.empty(); }

  // A lease whose report is forgotten, and what it had delivered.
  struct Dropped {
    v1::Lease lease;
    int64_t delivered = 0;
  };
  // The coordinator no longer knows `lease_id` (Revoke, Rejected): its
  // report, if unconfirmed, is forgotten.
  std::optional<Dropped> Drop(const std::string& lease_id);
  // `lease` is a new grant of a unit: the coordinator grants a unit again
  // only after its earlier lease ended, so the reports of other leases of
  // the same unit (epoch, sequence, shard) are forgotten.
  std::vector<Dropped> DropSameUnit(const v1::Lease& lease);

 private:
  struct Report {
    v1::Lease lease;
    int64_t delivered = 0;
    v1::TrainerMessage message;
    int64_t order = 0;
    uint64_t after_sync = 0;  // last_sync_id() when sent
  };
  std::map<std::string, Report> reports_;
  uint64_t last_sync_id_ = 0;
  uint64_t synced_ = 0;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_REPORT_LEDGER_H_
