#include "server/common/mix_order.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sluice {
namespace {

using i128 = __int128;

// Source s's j-th sample has the time (2kj + 2s + 1) / (2k c_s), k sources.
// Samples of source t placed before source s's j-th sample (c_s > 0).
int64_t BeforeFrom(const std::vector<int64_t>& counts, int32_t s, int64_t j,
                   size_t t) {
  const int64_t c_t = counts[t];
  if (c_t <= 0) return 0;
  if (static_cast<int32_t>(t) == s) return j;
  const i128 k2 = 2 * static_cast<i128>(counts.size());
  const i128 a = (k2 * j + 2 * s + 1) * c_t;
  const i128 c_s = counts[static_cast<size_t>(s)];
  // t's sample j' is earlier when (k2 j' + 2t + 1) * c_s < a, or == a with
  // t < s: k2 j' + 2t + 1 <= m.
  const i128 m = static_cast<int32_t>(t) < s ? a / c_s : (a - 1) / c_s;
  const i128 first = 2 * static_cast<i128>(t) + 1;
  if (m < first) return 0;
  const i128 n = (m - first) / k2 + 1;
  return static_cast<int64_t>(std::min<i128>(n, c_t));
}

int64_t PositionOf(const std::vector<int64_t>& counts, int32_t s, int64_t j) {
  int64_t p = 0;
  for (size_t t = 0; t < counts.size(); ++t) p += BeforeFrom(counts, s, j, t);
  return p;
}

}  // namespace

std::vector<int64_t> Apportion(int64_t total,
                               const std::vector<double>& weights) {
  std::vector<int64_t> out(weights.size(), 0);
  if (weights.empty() || total <= 0) return out;
  long double sum = 0;
  for (double w : weights) sum += w;
  std::vector<long double> rest(weights.size());
  int64_t given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const long double exact =
        static_cast<long double>(total) * weights[i] / sum;
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

int64_t MixCountBefore(const std::vector<int64_t>& counts, int32_t source,
                       int64_t position) {
  if (source < 0 || static_cast<size_t>(source) >= counts.size()) return 0;
  const int64_t c = counts[static_cast<size_t>(source)];
  if (c <= 0 || position <= 0) return 0;
  // The first j whose position is >= `position`.
  int64_t lo = 0;
  int64_t hi = c;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (PositionOf(counts, source, mid) < position) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

std::vector<int32_t> MixSources(const std::vector<int64_t>& counts,
                                int64_t begin, int64_t end) {
  std::vector<int32_t> out;
  if (end <= begin) return out;
  out.reserve(static_cast<size_t>(end - begin));
  const i128 k2 = 2 * static_cast<i128>(counts.size());
  std::vector<int64_t> next(counts.size());
  for (size_t s = 0; s < counts.size(); ++s)
    next[s] = MixCountBefore(counts, static_cast<int32_t>(s), begin);
  for (int64_t p = begin; p < end; ++p) {
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
    if (best < 0) break;  // past the epoch's end
    out.push_back(best);
    ++next[static_cast<size_t>(best)];
  }
  return out;
}

}  // namespace sluice
