#include "client/cpp/lost_deliveries.h"

#include <algorithm>

#include "server/common/work_unit.h"

namespace sluice::client_internal {

namespace {

std::tuple<int64_t, int64_t, int32_t> KeyOf(const v1::Lease& lease) {
  return {lease.epoch(), lease.unit().sequence(), UnitIndex(lease.unit())};
}

}  // namespace

void LostDeliveries::Lost(const v1::Lease& lease, int64_t delivered) {
  if (delivered <= 0) return;
  const int64_t begin = lease.unit().begin();
  const int64_t end = begin + delivered;
  auto [it, inserted] = ranges_.try_emplace(KeyOf(lease), begin, end);
  if (!inserted) {
    auto& [lo, hi] = it->second;
    if (begin <= hi && end >= lo) {  // overlapping or adjacent: one range
      lo = std::min(lo, begin);
      hi = std::max(hi, end);
    } else {
      it->second = {begin, end};  // the newer loss
    }
  }
}

int64_t LostDeliveries::AlreadyDelivered(const v1::Lease& lease) {
  auto it = ranges_.find(KeyOf(lease));
  if (it == ranges_.end()) return 0;
  auto& [lo, hi] = it->second;
  const int64_t begin = lease.unit().begin();
  const int64_t end = lease.unit().end();
  if (begin < lo || begin >= hi) return 0;
  const int64_t skip = std::min(hi, end) - begin;
  if (std::min(hi, end) >= hi) {
    ranges_.erase(it);
  } else {
    lo = begin + skip;
  }
  return skip;
}

void LostDeliveries::ForgetBefore(int64_t epoch) {
  ranges_.erase(ranges_.begin(),
                ranges_.lower_bound({epoch, INT64_MIN, INT32_MIN}));
}

}  // namespace sluice::client_internal
