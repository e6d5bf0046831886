// Granter: what a reader is granted next, and which data server it reads
// it from.
//
// Next decides one grant for one reader (a session's rank, worker and node)
// of one job: the first piece of the job's WorkQueues the reader may take,
// cut to what is left of its slot's quota, as the LeaseGranted record that
// grants it (fence, lease id, holder) and the data server it is routed to;
// or, when there is none, why the reader waits, in the words and kind its
// Waiting message carries. Route picks a unit's data server by rendezvous
// over the job's pool, preferring the reader's node and passing over the
// servers it reported it cannot reach; Hints lists the prefetch hints for
// the units next in line. The Granter decides and the service acts: it
// commits the record, adds the lease to its table and sends the grant. It
// takes pieces from the queues and notes hints in the registry, and
// nothing else changes.
//
// Not thread-safe: CoordinatorService keeps it under its lock.
#ifndef SLUICE_SERVER_COORDINATOR_GRANTER_H_
#define SLUICE_SERVER_COORDINATOR_GRANTER_H_

#include <cstdint>
#include <string>
#include <variant>

#include "absl/functional/function_ref.h"
#include "server/common/clock.h"
#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/data_server_registry.h"
#include "server/coordinator/durable_outbox.h"
#include "server/coordinator/lease_table.h"
#include "server/coordinator/session_table.h"
#include "server/coordinator/work_queues.h"
#include "sluice/v1/coordinator.pb.h"
#include "sluice/v1/journal.pb.h"

namespace sluice {

class Granter {
 public:
  // `queues`, `registry`, `clock` and `leases` outlive the Granter. Hints
  // name at most `prefetch_hint_units` units ahead (0 = none). With
  // `leases`, grants of dynamic jobs whose units are ranges of one shard
  // are steered: among the next WorkQueues::kSteerLookahead pieces, the
  // first one that a live lease of another job also reads (some of the same
  // samples of the same shard) is taken before the front. Both jobs then
  // read that shard from the same data server at about the same time, and
  // it decodes each image once for both (decoded_image_cache.h). Null = the
  // front piece always.
  Granter(WorkQueues* queues, DataServerRegistry* registry, Clock* clock,
          int prefetch_hint_units, const LeaseTable* leases = nullptr)
      : queues_(queues),
        registry_(registry),
        clock_(clock),
        leases_(leases),
        prefetch_hint_units_(prefetch_hint_units) {}

  struct Grant {
    v1::internal::JournalRecord record;  // lease_granted
    Piece piece;
    std::string data_server;  // "" when none is live
    bool same_node = false;   // the data server is on the reader's node
  };
  struct Wait {
    v1::WaitingKind kind = v1::WAITING_KIND_UNSPECIFIED;
    std::string reason;  // "" = nothing to tell the reader
  };
  // The reader's next grant in `job`'s current epoch, at a fence of at
  // least `fence_floor` (what data servers report having seen) and
  // job.next_fence. A remainder an expired lease returned to another slot
  // is passed over while `keeps(that slot)`.
  std::variant<Grant, Wait> Next(const Session& reader, const JobData& job,
                                 uint64_t fence_floor,
                                 absl::FunctionRef<bool(int32_t slot)> keeps);

  // Where unit `sequence` of a shard (or window, or mixed block) is read:
  // rendezvous over the job's pool by the shard's URL; a window's units by
  // its first shard's URL when its shards are remote (each is then
  // downloaded by one server), else each unit by that URL and its sequence
  // (the window's units spread over the servers); a mixed block by the
  // shard its first sample is read from. For `reader` (when given), a
  // server on its node first, passing over the servers it cannot reach;
  // `*same_node` (optional): whether the server is on the reader's node.
  std::string Route(const JobData& job, int32_t shard_index, int64_t sequence,
                    const Session* reader = nullptr, bool* same_node = nullptr);

  // Adds to `fx` a PrefetchHint for each remote shard of the units next in
  // line for `slot`, to the server each will be routed to, once per shard
  // and server (DataServerRegistry::NoteHint).
  void Hints(const JobData& job, int32_t slot, Effects& fx);

 private:
  WorkQueues* const queues_;
  DataServerRegistry* const registry_;
  Clock* const clock_;
  const LeaseTable* const leases_;  // null = no steering
  const int prefetch_hint_units_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_GRANTER_H_
