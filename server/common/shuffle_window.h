// Shuffle windows: the sample-level shuffle shared by the coordinator (which
// plans windows) and the data servers (which serve them).
//
// With JobSpec.shuffle and shuffle_window S > 1, an epoch's shards (in their
// shuffled order) are grouped into windows of at least S consecutive shards
// each (all of them when fewer): m = max(1, n / S) windows, window w holding
// shuffled shards [w*n/m, (w+1)*n/m) (integer division). A window is served
// as one sequence of positions 0..N-1, N = the sum of its shards' samples,
// in which the shards are interleaved at random and each shard's samples
// keep their file order:
//
//   labels = [0] * n_0 ++ [1] * n_1 ++ ... (piece k repeated n_k times)
//   Fisher-Yates from the back with SplitMix64(order_seed, 0) (see
//   SplitMix64 below): for i = N-1 down to 1, j = Next() mod (i+1),
//   swap(labels[i], labels[j]).
//   Position p serves piece labels[p]'s next sample: its sample number
//   (count of labels[p] in labels[0..p)).
//
// Every shard's samples are read front to back (cheap for compressed tars
// too), yet consecutive positions come from shards drawn in proportion to
// what each has left: a batch of B samples from a window of S equal shards
// holds about S * (1 - (1 - 1/S)^B) distinct shards.
// order_seed = WindowOrderSeed(job seed, epoch, w).
#ifndef SLUICE_SERVER_COMMON_SHUFFLE_WINDOW_H_
#define SLUICE_SERVER_COMMON_SHUFFLE_WINDOW_H_

#include <cstdint>
#include <vector>

namespace sluice {

// SplitMix64 with a state initialised to Mix(seed) XOR Mix(stream XOR
// 0xD1B54A32D192ED03); each Next() adds 0x9E3779B97F4A7C15 to the state and
// returns Mix(state), where
//   Mix(z) = z ^= z >> 30, z *= 0xBF58476D1CE4E5B9, z ^= z >> 27,
//            z *= 0x94D049BB133111EB, z ^= z >> 31   (all mod 2^64).
class SplitMix64 {
 public:
  SplitMix64(uint64_t seed, int64_t stream)
      : state_(Mix(seed) ^
               Mix(static_cast<uint64_t>(stream) ^ 0xD1B54A32D192ED03ULL)) {}
  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    return Mix(state_);
  }
  static uint64_t Mix(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z;
  }

 private:
  uint64_t state_;
};

// Most shards one window may hold (labels are 16-bit).
inline constexpr int32_t kMaxShuffleWindowShards = 1024;

// The interleave seed of window `window` of epoch `epoch`:
// Mix(Mix(seed) ^ Mix(epoch ^ 0xA0761D6478BD642F) ^ Mix(window + 1)).
inline uint64_t WindowOrderSeed(uint64_t seed, int64_t epoch, int64_t window) {
  return SplitMix64::Mix(
      SplitMix64::Mix(seed) ^
      SplitMix64::Mix(static_cast<uint64_t>(epoch) ^ 0xA0761D6478BD642FULL) ^
      SplitMix64::Mix(static_cast<uint64_t>(window) + 1));
}

// The window's labels: which piece serves each position (see above).
// piece_samples.size() <= kMaxShuffleWindowShards * 2.
std::vector<uint16_t> WindowLabels(const std::vector<int64_t>& piece_samples,
                                   uint64_t order_seed);

// Which shards of `num_shards` (given in served order) form each window.
// Returns the first shard position of every window plus num_shards at the
// end; a window size of 1 or less gives one window per shard.
std::vector<int32_t> WindowBounds(int32_t num_shards, int32_t window);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_SHUFFLE_WINDOW_H_
