#include "server/common/mix_order.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

namespace sluice {
namespace {

using i128 = __int128;

}  // namespace

std::vector<int64_t> Apportion(int64_t total,
                               const std::vector<double>& weights) {
  std::vector<int64_t> out(weights.size(), 0);
  if (weights.empty() || total <= 0) return out;
  // Relative to the largest weight, so that no sum or product overflows
  // (weights are positive and finite; anything else counts as 0).
  long double largest = 0;
  for (double w : weights) {
    if (std::isfinite(w) && w > largest) largest = w;
  }
  if (largest <= 0) largest = 1;
  std::vector<long double> share(weights.size(), 0);
  long double sum = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (std::isfinite(weights[i]) && weights[i] > 0)
      share[i] = weights[i] / largest;
    sum += share[i];
  }
  if (sum <= 0) {
    share.assign(weights.size(), 1);
    sum = static_cast<long double>(weights.size());
  }
  std::vector<long double> rest(weights.size());
  int64_t given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const long double exact = static_cast<long double>(total) * share[i] / sum;
    out[i] = static_cast<int64_t>(std::floor(exact));
    rest[i] = exact - static_cast<long double>(out[i]);
    given += out[i];
  }
  // Largest remainders first, ties to the earlier source. (Rounding at the
  // extremes of long double could leave `given` off by a sample either way;
  // the loops still make the split sum to `total`.)
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rest[a] > rest[b]; });
  for (size_t k = 0; given < total; k = (k + 1) % order.size()) {
    ++out[order[k]];
    ++given;
  }
  for (size_t k = order.size(); given > total;) {
    k = (k + order.size() - 1) % order.size();
    if (out[order[k]] > 0) {
      --out[order[k]];
      --given;
    }
  }
  return out;
}

namespace {

// The source whose next sample (next[s] of counts[s]) comes first; -1 when
// all are used up.
int32_t Earliest(const std::vector<int64_t>& counts,
                 const std::vector<int64_t>& next) {
  const i128 k2 = 2 * static_cast<i128>(counts.size());
  int32_t best = -1;
  for (size_t s = 0; s < counts.size(); ++s) {
    if (next[s] >= counts[s]) continue;
    if (best < 0) {
      best = static_cast<int32_t>(s);
      continue;
    }
    const size_t b = static_cast<size_t>(best);
    // Earlier time (ties keep the lower index).
    if ((k2 * next[s] + 2 * static_cast<i128>(s) + 1) * counts[b] <
        (k2 * next[b] + 2 * static_cast<i128>(b) + 1) * counts[s]) {
      best = static_cast<int32_t>(s);
    }
  }
  return best;
}

}  // namespace

std::vector<int64_t> MixCountsBefore(const std::vector<int64_t>& counts,
                                     int64_t position) {
  const auto k = static_cast<int64_t>(counts.size());
  int64_t total = 0;
  for (int64_t c : counts) total += std::max<int64_t>(c, 0);
  std::vector<int64_t> n(counts.size(), 0);
  if (position <= 0 || total == 0) return n;
  if (position >= total) {
    for (size_t s = 0; s < counts.size(); ++s)
      n[s] = std::max<int64_t>(counts[s], 0);
    return n;
  }
  // Every sample whose time is below T = (position - h) / total, h =
  // ceil(k/2): source s has between T c_s - (s + 1/2)/k and that + 1 of
  // them, so at most position - h + k/2 <= position in all and at least
  // position - h - k/2 >= position - k - 1. Source s's j-th sample is
  // below T when (2kj + 2s + 1) * total < 2k * c_s * (position - h).
  const i128 k2 = 2 * static_cast<i128>(k);
  const i128 front = static_cast<i128>(position) - (k + 1) / 2;
  int64_t placed = 0;
  if (front > 0) {
    for (size_t s = 0; s < counts.size(); ++s) {
      const int64_t c = counts[s];
      if (c <= 0) continue;
      const i128 a = k2 * c * front;
      // 2kj + 2s + 1 <= m (64-bit division when it fits: far cheaper).
      const i128 m =
          a <= INT64_MAX
              ? static_cast<i128>(static_cast<int64_t>(a - 1) / total)
              : (a - 1) / total;
      const i128 first = 2 * static_cast<i128>(s) + 1;
      if (m < first) continue;
      n[s] = static_cast<int64_t>(std::min<i128>((m - first) / k2 + 1, c));
      placed += n[s];
    }
  }
  // The rest, in order.
  for (; placed < position; ++placed) {
    const int32_t s = Earliest(counts, n);
    if (s < 0) break;
    ++n[static_cast<size_t>(s)];
  }
  return n;
}

int64_t MixCountBefore(const std::vector<int64_t>& counts, int32_t source,
                       int64_t position) {
  if (source < 0 || static_cast<size_t>(source) >= counts.size()) return 0;
  return MixCountsBefore(counts, position)[static_cast<size_t>(source)];
}

std::vector<int32_t> MixSourcesFrom(const std::vector<int64_t>& counts,
                                    std::vector<int64_t> next, int64_t n) {
  std::vector<int32_t> out;
  if (n <= 0) return out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) {
    const int32_t s = Earliest(counts, next);
    if (s < 0) break;  // past the epoch's end
    out.push_back(s);
    ++next[static_cast<size_t>(s)];
  }
  return out;
}

std::vector<int32_t> MixSources(const std::vector<int64_t>& counts,
                                int64_t begin, int64_t end) {
  if (end <= begin) return {};
  return MixSourcesFrom(counts, MixCountsBefore(counts, begin), end - begin);
}

}  // namespace sluice
