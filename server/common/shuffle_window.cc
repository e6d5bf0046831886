#include "server/common/shuffle_window.h"

#include <algorithm>

namespace sluice {

std::vector<uint16_t> WindowLabels(const std::vector<int64_t>& piece_samples,
                                   uint64_t order_seed) {
  int64_t total = 0;
  for (int64_t n : piece_samples) total += std::max<int64_t>(n, 0);
  std::vector<uint16_t> labels;
  labels.reserve(static_cast<size_t>(total));
  for (size_t k = 0; k < piece_samples.size(); ++k) {
    labels.insert(labels.end(),
                  static_cast<size_t>(std::max<int64_t>(piece_samples[k], 0)),
                  static_cast<uint16_t>(k));
  }
  SplitMix64 rng(order_seed, 0);
  for (int64_t i = total - 1; i >= 1; --i) {
    const uint64_t j = rng.Next() % static_cast<uint64_t>(i + 1);
    std::swap(labels[static_cast<size_t>(i)], labels[j]);
  }
  return labels;
}

std::vector<int32_t> WindowBounds(int32_t num_shards, int32_t window) {
  std::vector<int32_t> bounds;
  if (num_shards <= 0) {
    bounds.push_back(0);
    return bounds;
  }
  const int64_t n = num_shards;
  const int64_t m = window <= 1 ? n : std::max<int64_t>(1, n / window);
  bounds.reserve(static_cast<size_t>(m + 1));
  for (int64_t w = 0; w <= m; ++w)
    bounds.push_back(static_cast<int32_t>(w * n / m));
  return bounds;
}

}  // namespace sluice
