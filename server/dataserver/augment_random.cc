#include "server/dataserver/augment_random.h"

namespace sluice::dataserver {
namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57;
constexpr uint32_t kWeyl0 = 0x9E3779B9;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85;  // sqrt(3) - 1

void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

}  // namespace

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c,
                                   std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kMultiplier0, c[0], &hi0, &lo0);
    MulHiLo(kMultiplier1, c[2], &hi1, &lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k = {k[0] + kWeyl0, k[1] + kWeyl1};
  }
  return c;
}

std::array<uint32_t, 4> SampleRandom::Words(int position, int draw) const {
  const uint64_t index = static_cast<uint64_t>(index_);
  const std::array<uint32_t, 4> counter = {
      static_cast<uint32_t>(index),
      static_cast<uint32_t>((index >> 32) & 0x3FFFF) |
          static_cast<uint32_t>(draw & 63) << 18 |
          static_cast<uint32_t>(position & 63) << 24,
      static_cast<uint32_t>(shard_), static_cast<uint32_t>(epoch_)};
  return Philox4x32(counter, {static_cast<uint32_t>(seed_),
                              static_cast<uint32_t>(seed_ >> 32)});
}

}  // namespace sluice::dataserver
