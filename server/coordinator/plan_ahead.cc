#include "server/coordinator/plan_ahead.h"

#include <utility>

namespace sluice {

std::vector<std::deque<Piece>> FreshQueues(const EpochPlan& plan,
                                           bool per_slot) {
  std::vector<std::deque<Piece>> queues(
      per_slot ? static_cast<size_t>(plan.num_slots()) : 1);
  for (const PlannedUnit& u : plan.units) {
    queues[per_slot ? u.slot : 0].push_back(
        Piece{u.sequence, u.shard_index, u.begin, u.end, u.rank, u.slot});
  }
  return queues;
}

PlannedAhead PlanAhead(const PlanInputs& inputs, bool per_slot,
                       uint64_t serial) {
  PlannedAhead out;
  out.prepared.options = inputs.options;
  out.prepared.epoch = inputs.epoch;
  out.prepared.serial = serial;
  out.prepared.shard_samples = inputs.shard_samples;
  out.prepared.mix = inputs.mix;
  out.prepared.plan = inputs.Plan();
  out.queues = FreshQueues(out.prepared.plan, per_slot);
  return out;
}

}  // namespace sluice
