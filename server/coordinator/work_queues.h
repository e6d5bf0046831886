// WorkQueues: the work of each job's current epoch not yet granted, in the
// order it is granted, and what grants derive from that epoch.
//
// A static job with a world size has one queue per reader slot (its plan
// gives each slot its own units); every other job one queue its readers
// share. A grant takes the front piece a slot may read (Take), or one a
// little further on that the caller prefers, split at the reader's quota
// with the rest left in its place; a lease's unread remainder
// comes back to the front of its slot's queue (Return), and an expired
// lease's remainder is skipped by other slots while its own slot keeps it
// for its reader to come back. The queues are derived, never journaled:
// rebuilt from the durable state when a job's epoch or plan changes
// (Rebuild), or taken whole from the fresh queues computed with a plan made
// ahead of its epoch (Offer). Beside them, per job and epoch: its shuffle
// windows and, for a mixed job, the shard URL each block is routed by.
//
// Not thread-safe: CoordinatorService keeps it under its lock.
#ifndef SLUICE_SERVER_COORDINATOR_WORK_QUEUES_H_
#define SLUICE_SERVER_COORDINATOR_WORK_QUEUES_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/epoch_planner.h"

namespace sluice {

class WorkQueues {
 public:
  // Installs `job`'s queues for its current epoch: the fresh queues offered
  // with the plan its epoch was installed from (job.plan_serial) when
  // nothing of the epoch is granted or acknowledged yet, else the pieces
  // `pending()` lists (what the state has not granted), each in its slot's
  // queue. Fresh queues of plans no longer `offered` are dropped.
  void Rebuild(const JobData& job,
               absl::FunctionRef<std::vector<Piece>()> pending,
               absl::FunctionRef<bool(uint64_t serial)> offered);
  // Keeps the fresh queues of plan `serial`, made ahead of an epoch of job
  // `name`, for the Rebuild that installs that plan; drops those of plans
  // no longer `offered`.
  void Offer(const std::string& name, uint64_t serial,
             std::vector<std::deque<Piece>> queues,
             absl::FunctionRef<bool(uint64_t serial)> offered);
  // Forgets the job (deleted).
  void Erase(const std::string& name);

  // Why Take found no piece.
  enum class Shortage {
    kNone,
    kEmpty,             // the queue is empty
    kOthersRemainders,  // it holds only remainders kept for other slots
  };
  // Takes the first piece `slot` may read, at most `limit` (> 0) samples of
  // it (the rest stays at the front). A remainder returned to another slot
  // is passed over while `keeps(that slot)`. Nothing, and `*why`, when no
  // piece qualifies.
  std::optional<Piece> Take(const JobData& job, int32_t slot, int64_t limit,
                            absl::FunctionRef<bool(int32_t slot)> keeps,
                            Shortage* why);
  // The same, taking instead the first piece within kSteerLookahead of the
  // front that the slot may read and `prefer`s, when there is one.
  std::optional<Piece> Take(const JobData& job, int32_t slot, int64_t limit,
                            absl::FunctionRef<bool(int32_t slot)> keeps,
                            absl::FunctionRef<bool(const Piece&)> prefer,
                            Shortage* why);
  static constexpr int kSteerLookahead = 64;
  // Puts `piece` (a lease's unread remainder) back at the front of
  // `slot`'s queue.
  void Return(const JobData& job, int32_t slot, const Piece& piece);
  // The pieces next in line for `slot`, front first (prefetch hints).
  const std::deque<Piece>& Upcoming(const JobData& job, int32_t slot);

  // The shuffle windows of `job`'s current epoch (PlanWindows; computed
  // once per epoch). Empty unless the job uses windows.
  const std::vector<ShuffleWindow>& Windows(const JobData& job);
  // A mixed job: the URL unit `block` of its current epoch is routed by,
  // the shard its first sample is read from ("" if none); remembered per
  // block for the epoch.
  const std::string& BlockRoute(const JobData& job, int32_t block);

 private:
  struct JobQueues {
    std::vector<std::deque<Piece>> queues;  // per slot, or [0] for all
    // The grant queues of each epoch plan on offer, by its serial.
    std::map<uint64_t, std::vector<std::deque<Piece>>> fresh;
    int64_t windows_epoch = -1;
    std::vector<ShuffleWindow> windows;
    int64_t routes_epoch = -1;
    std::map<int32_t, std::string> block_routes;
  };
  static bool PerSlot(const JobData& job);
  // `slot`'s queue, the job's queues sized for its plan if they were not.
  std::deque<Piece>& QueueOf(const JobData& job, int32_t slot);
  static void KeepOffered(JobQueues& q,
                          absl::FunctionRef<bool(uint64_t serial)> offered);

  std::map<std::string, JobQueues> jobs_;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_WORK_QUEUES_H_
