// The serving order of a mixed unit (MixedUnit, a job with sources):
// which of the unit's pieces serves each position, and where each piece starts.
// Pure; the data server computes it once per ReadSamples, and the
// coordinator to name the samples of a mixed range it audits.
#ifndef SLUICE_SERVER_COMMON_MIXED_UNIT_H_
#define SLUICE_SERVER_COMMON_MIXED_UNIT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/v1/common.pb.h"

namespace sluice {

// Most positions of one mixed unit or shuffle window a data server accepts
// (each costs two bytes of labels).
inline constexpr int64_t kMaxUnitLabels = int64_t{1} << 26;

struct MixedOrder {
  // labels[p - unit.begin]: the piece serving position p.
  std::vector<uint16_t> labels;
  // The sample of each piece's shard served first (its samples before are
  // served by other units).
  std::vector<int64_t> first;
};

// Window labels (shuffle_window.h's WindowLabels) for pieces of these sizes;
// the data server's cached lookup.
using WindowLabelsFn =
    std::function<std::shared_ptr<const std::vector<uint16_t>>(
        const std::vector<int64_t>& sizes, uint64_t order_seed)>;

// Validates `lease.unit.mixed`'s mix, segments and pieces (INVALID_ARGUMENT
// naming the lease and field) and computes their order.
absl::StatusOr<MixedOrder> OrderMixedUnit(const v1::Lease& lease,
                                          const WindowLabelsFn& window_labels);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_MIXED_UNIT_H_
