// Mix order: how a job with several sources (JobSpec.sources) interleaves
// them, shared by the coordinator (which plans and routes units) and the data
// servers (which serve them).
//
// Shares. An epoch of L samples (JobSpec.samples_per_epoch, or the sum of the
// sources' samples_per_epoch) gives a source with an explicit
// samples_per_epoch exactly that, and splits the rest R over the weighted
// sources by largest remainder (Apportion): source s first gets
// floor(R * w_s / sum(w)); the samples left over go one each to the sources
// with the largest fractional parts, ties to the earlier source.
//
// Order. With counts c_0..c_{k-1} (c_s = source s's samples in the epoch,
// L = their sum), source s's j-th sample (j = 0..c_s-1) has the time
// (j + (s + 1/2) / k) / c_s, and the epoch's positions 0..L-1 list all
// samples by time, ties to the lower source index. Every source is spread
// evenly over the whole epoch, the sources' phases staggered so that sources
// of equal size alternate. Any stretch of W consecutive positions (of the
// epoch, and so of any rank's block of it) holds each source s a count
// within
//     |count_s - W * c_s / L| < 1 + (k - 2) * c_s / L     (k >= 2 sources)
// of its share: within +-1 for two sources, and below 1.5 for three whose
// largest share is at most half. (Each source's count of the positions up
// to any time lies in an interval of width 1 around its share, so the
// deviation of a prefix spans less than (1 - w) + (k - 1) w, w = c_s / L.)
// How many of each source precede any position takes O(k^2) arithmetic
// (MixCountsBefore), so a unit anywhere in the epoch is served without
// replaying the sequence before it.
#ifndef SLUICE_SERVER_COMMON_MIX_ORDER_H_
#define SLUICE_SERVER_COMMON_MIX_ORDER_H_

#include <cstdint>
#include <vector>

namespace sluice {

// Most sources one job may mix.
inline constexpr int32_t kMaxMixSources = 256;

// Largest-remainder split of `total` over `weights` (all > 0). The result
// sums to `total`.
std::vector<int64_t> Apportion(int64_t total,
                               const std::vector<double>& weights);

// How many of positions [0, position) belong to each source, for an epoch
// of `counts` (each >= 0). position is clamped to [0, sum(counts)]. O(k^2)
// for k sources: the samples before a time a little earlier than
// `position`, counted in closed form, then the last few merged in order.
std::vector<int64_t> MixCountsBefore(const std::vector<int64_t>& counts,
                                     int64_t position);
// The same for one source.
int64_t MixCountBefore(const std::vector<int64_t>& counts, int32_t source,
                       int64_t position);

// The source of each position in [begin, end).
std::vector<int32_t> MixSources(const std::vector<int64_t>& counts,
                                int64_t begin, int64_t end);
// The same for `n` positions from the one where each source has served
// next[s] samples (next = MixCountsBefore(counts, begin)).
std::vector<int32_t> MixSourcesFrom(const std::vector<int64_t>& counts,
                                    std::vector<int64_t> next, int64_t n);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_MIX_ORDER_H_
