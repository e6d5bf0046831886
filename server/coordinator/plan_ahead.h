// Planning an epoch outside the coordinator's state lock.
//
// An epoch's plan and the grant queues it starts with are pure functions
// of the job's shape, its plan options and the epoch (PlanInputs): the
// service copies those out under its lock, plans here without it, and
// offers the result back (CoordinatorState::OfferPlan) ahead of the
// journal record that installs the epoch. For a job of 16,384 readers over
// 43,000 shards that is 5-12 ms of CPU the lock is no longer held for.
#ifndef SLUICE_SERVER_COORDINATOR_PLAN_AHEAD_H_
#define SLUICE_SERVER_COORDINATOR_PLAN_AHEAD_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/epoch_planner.h"

namespace sluice {

// The grant queues of an epoch of which nothing is granted or acknowledged
// yet: its planned units in served order, one queue per reader slot
// (`per_slot`, static jobs with a world size) or one for all. The same as
// queueing CoordinatorState::PendingPieces of such an epoch.
std::vector<std::deque<Piece>> FreshQueues(const EpochPlan& plan,
                                           bool per_slot);

// An epoch planned ahead, and its fresh grant queues.
struct PlannedAhead {
  PreparedPlan prepared;
  std::vector<std::deque<Piece>> queues;
};

// Plans `inputs` (no lock needed: the inputs are copies or immutable).
// `serial` (> 0) tells this plan from any other once installed.
PlannedAhead PlanAhead(const PlanInputs& inputs, bool per_slot,
                       uint64_t serial);

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_PLAN_AHEAD_H_
