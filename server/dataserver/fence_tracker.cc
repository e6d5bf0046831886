#include "server/dataserver/fence_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/common/quote.h"
#include "server/common/work_unit.h"

namespace sluice::dataserver {

absl::Status FenceTracker::Check(const v1::Lease& lease) {
  auto [it, new_job] = jobs_.try_emplace(lease.job());
  JobFences& job = it->second;
  if (!new_job && lease.epoch() != job.epoch) {
    if (lease.fence() <= job.max_fence) {
      return absl::AbortedError(absl::StrCat(
          "lease ", QuotePrefix(lease.lease_id()), " (job ",
          QuotePrefix(lease.job()), ") is for epoch ", lease.epoch(),
          " with fence ", lease.fence(), ", but leases of epoch ", job.epoch,
          " up to fence ", job.max_fence,
          " were already presented: the job has moved on"));
    }
    for (const auto& [unit, ranges] : job.units) ranges_ -= ranges.size();
    job.units.clear();
  }
  job.epoch = lease.epoch();
  const int64_t begin = lease.unit().begin(), end = lease.unit().end();
  std::vector<FencedRange>& ranges = job.units[absl::StrCat(
      lease.unit().sequence(), "/", UnitIndex(lease.unit()))];
  for (const FencedRange& r : ranges) {
    if (r.begin < end && begin < r.end && lease.fence() < r.fence) {
      return absl::AbortedError(absl::StrCat(
          "lease ", QuotePrefix(lease.lease_id()), " (job ",
          QuotePrefix(lease.job()), ") has fence ", lease.fence(),
          " but fence ", r.fence, " was already presented for samples [",
          r.begin, ", ", r.end, ") of ", UnitKindName(lease.unit()), " ",
          UnitIndex(lease.unit()), ": the lease was granted again"));
    }
  }
  // Ranges this lease covers whole are superseded by it.
  const size_t before = ranges.size();
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                              [&](const FencedRange& r) {
                                return r.fence <= lease.fence() &&
                                       begin <= r.begin && r.end <= end;
                              }),
               ranges.end());
  ranges.push_back(FencedRange{begin, end, lease.fence()});
  ranges_ = ranges_ - before + ranges.size();
  job.max_fence = std::max(job.max_fence, lease.fence());
  max_fence_seen_ = std::max(max_fence_seen_, lease.fence());
  if (ranges_ > max_ranges_) ForgetRanges();
  return absl::OkStatus();
}

void FenceTracker::ForgetRanges() {
  for (auto& [name, job] : jobs_) job.units.clear();
  ranges_ = 0;
}

}  // namespace sluice::dataserver
