// Shared by the benchmarks: a directory of ~85 KB JPEG samples in tar shards.
#ifndef SLUICE_TESTS_BENCH_BENCH_UTIL_H_
#define SLUICE_TESTS_BENCH_BENCH_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sluice::bench {

// 16 distinct 500x375 textured JPEGs (~85 KB each).
std::vector<std::string> MakeJpegs();

// Writes `shards` tars of `per_shard` samples (jpg + cls) into `dir`;
// sample i of every shard uses jpegs[(s * per_shard + i) % jpegs.size()].
// Returns (path, samples) per shard.
std::vector<std::pair<std::string, int64_t>> WriteShards(
    const std::string& dir, int shards, int per_shard,
    const std::vector<std::string>& jpegs);

}  // namespace sluice::bench

#endif  // SLUICE_TESTS_BENCH_BENCH_UTIL_H_
