// Which leases a data server still serves: the coordinator raises a lease's
// fence every time it grants samples again, so a lease presented after one
// with a higher fence over any of the same samples is a stale holder's
// (ABORTED), and it must not read what the new holder reads.
//
// The coordinator's fences only grow (across jobs too), and a job's epoch
// e+1 is granted only after every unit of epoch e completed, so only the
// newest epoch's units need remembering: a lease of another epoch is stale
// unless its fence is above every fence seen for the job (then the job
// moved: a later epoch, an epoch rolled back by a resume, or the job created
// again under its name). Fences are kept per sample range, since the pieces
// of a unit split at a quota boundary share its sequence number but never a
// sample, and both are valid.
//
// Pure and not thread-safe: DataServerService calls it under its lock.
#ifndef SLUICE_SERVER_DATASERVER_FENCE_TRACKER_H_
#define SLUICE_SERVER_DATASERVER_FENCE_TRACKER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice::dataserver {

// Ranges remembered over all jobs before the tracker forgets them (keeping
// each job's epoch and newest fence): a million units in one epoch.
inline constexpr size_t kMaxFencedRanges = size_t{1} << 20;

class FenceTracker {
 public:
  explicit FenceTracker(size_t max_ranges = kMaxFencedRanges)
      : max_ranges_(max_ranges) {}

  // OK and remembered when `lease` is current; ABORTED naming the lease, the
  // job and the fence that supersedes it when it is stale.
  absl::Status Check(const v1::Lease& lease);

  // Ranges remembered over all jobs (the memory bound).
  size_t ranges() const { return ranges_; }
  // The newest fence presented, over all jobs (0 = none).
  uint64_t max_fence_seen() const { return max_fence_seen_; }

 private:
  struct FencedRange {
    int64_t begin = 0;
    int64_t end = 0;
    uint64_t fence = 0;
  };
  struct JobFences {
    int64_t epoch = 0;
    uint64_t max_fence = 0;
    // Fenced ranges per unit ("sequence/UnitIndex") of `epoch`.
    absl::flat_hash_map<std::string, std::vector<FencedRange>> units;
  };
  // Drops every job's ranges, keeping its epoch and newest fence.
  void ForgetRanges();

  size_t max_ranges_;
  absl::flat_hash_map<std::string, JobFences> jobs_;
  size_t ranges_ = 0;
  uint64_t max_fence_seen_ = 0;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_FENCE_TRACKER_H_
