#include "server/dataserver/augment_random.h"

#include <Random123/philox.h>

namespace sluice::dataserver {

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter,
                                   std::array<uint32_t, 2> key) {
  r123::Philox4x32 philox;  // 10 rounds
  const r123::Philox4x32::ctr_type c = {
      {counter[0], counter[1], counter[2], counter[3]}};
  const r123::Philox4x32::key_type k = {{key[0], key[1]}};
  const r123::Philox4x32::ctr_type out = philox(c, k);
  return {out[0], out[1], out[2], out[3]};
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
