// libFuzzer target over the tar reader, the sample index, the decoders and
// the SampleBatch framing. Input: one flag byte, then the shard's bytes.
//   flags & 3: 0 = tar path, 1 = JPEG, 2 = PNG, 3 = npy decoder on the rest
//   flags & 4: resize/crop images
// Build and run: make fuzz (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/dataserver/decoders.h"
#include "server/dataserver/sample_encoder.h"
#include "server/format/tar_shard_reader.h"

using namespace sluice::dataserver;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  ImageOptions image;
  if (flags & 4) image = ImageOptions{17, 9, 13};
  switch (flags & 3) {
    case 1:
      (void)DecodeField(Codec::kJpeg, Payload{bytes, nullptr}, image);
      return 0;
    case 2:
      (void)DecodeField(Codec::kPng, Payload{bytes, nullptr}, image);
      return 0;
    case 3:
      (void)DecodeField(Codec::kNpy, Payload{bytes, nullptr}, image);
      return 0;
    default:
      break;
  }
  auto shard = ShardData::FromString(std::move(bytes), "fuzz.tar");
  auto index = std::make_shared<const ShardIndex>(BuildShardIndex(shard));
  for (int64_t begin : {int64_t{0}, index->num_samples() / 2}) {
    auto reader = TarSampleReader::Open(shard, index, begin);
    if (!reader.ok()) continue;
    BatchEncoder encoder(4096);
    std::vector<EncodedMessage> messages;
    for (int i = 0; i < 64; ++i) {
      auto sample = (*reader)->Next();
      if (!sample.ok() || !sample->has_value()) break;
      OutSample out;
      out.key = (*sample)->key;
      out.index = (*sample)->index;
      out.skipped = !(*sample)->corrupt.empty();
      out.skip_reason = (*sample)->corrupt;
      for (const RawField& f : (*sample)->fields) {
        auto decoded = DecodeField(CodecForField(f.name), f.data, image);
        if (!decoded.ok()) continue;
        out.fields.push_back(OutField{f.name, *std::move(decoded)});
      }
      encoder.Add(std::move(out), &messages);
    }
    encoder.Flush(&messages);
    for (const EncodedMessage& m : messages) (void)m.Flatten();
  }
  return 0;
}
