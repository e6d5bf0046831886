// Stateless randomness for image augmentations: every random choice of a
// sample's transforms is a pure function of (seed, epoch, shard, sample
// index, transform position, draw), so the same sample gets the same crop
// and flip on any data server, after a re-route mid-unit and after a resume,
// and a new epoch gets new choices.
//
// The generator is Philox4x32-10 (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC'11), the counter-based generator of TensorFlow's
// stateless ops and JAX: key = (low 32 bits of seed, high 32 bits of seed);
// counter = (low 32 bits of index, high 18 bits of index | draw << 18 |
// position << 24, shard, low 32 bits of epoch). One call gives four 32-bit
// words; word w as a uniform double in [0, 1) is w / 2^32.
#ifndef SLUICE_SERVER_DATASERVER_AUGMENT_RANDOM_H_
#define SLUICE_SERVER_DATASERVER_AUGMENT_RANDOM_H_

#include <array>
#include <cstdint>

namespace sluice::dataserver {

// Philox4x32 with 10 rounds (Random123's r123::Philox4x32).
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter,
                                   std::array<uint32_t, 2> key);

class SampleRandom {
 public:
  // Positions are < 64 and draws < 64; sample indices < 2^50.
  static constexpr int kMaxPositions = 64;
  static constexpr int kMaxDraws = 64;

  SampleRandom(uint64_t seed, int64_t epoch, int32_t shard, int64_t index)
      : seed_(seed), epoch_(epoch), shard_(shard), index_(index) {}

  // Four words for draw `draw` of the transform at `position`.
  std::array<uint32_t, 4> Words(int position, int draw) const;
  // A word as a uniform double in [0, 1).
  static double Unit(uint32_t word) { return word * (1.0 / 4294967296.0); }

 private:
  uint64_t seed_;
  int64_t epoch_;
  int32_t shard_;
  int64_t index_;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_AUGMENT_RANDOM_H_
