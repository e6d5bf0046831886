// Hand-written protobuf framing of SampleBatch messages, so that member
// bytes and decoded tensors reach gRPC as slices over their own buffers
// instead of being copied into a serialized message (as Arrow Flight does
// for its bodies). The bytes produced are exactly what
// SampleBatch::SerializeAsString() would give for the same content, so any
// protobuf parser reads them.
//
// Worked example: one sample "a" (index 3) with a raw field "cls" = "7"
//   0a 0e                 SampleBatch.samples, 14 bytes
//     0a 01 'a'           Sample.key
//     10 03               Sample.index
//     1a 09               Sample.fields, 9 bytes
//       0a 03 'cls'       Field.name
//       12 01 '7'         Field.raw  <- payloads >= kInlineLimit are slices
#ifndef SLUICE_SERVER_DATASERVER_SAMPLE_ENCODER_H_
#define SLUICE_SERVER_DATASERVER_SAMPLE_ENCODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/dataserver/decoders.h"
#include "server/format/tar_shard_reader.h"

namespace sluice::dataserver {

// A sample ready to be framed.
struct OutField {
  std::string name;
  DecodedField value;
};
struct OutSample {
  std::string key;
  int64_t index = 0;
  std::vector<OutField> fields;
  bool skipped = false;
  std::string skip_reason;
  int32_t piece = 0;  // Sample.piece (window units)
};

// One serialized SampleBatch as a list of chunks. Small pieces live in one
// shared header buffer; large payloads are referenced, not copied.
class EncodedMessage {
 public:
  struct Chunk {
    absl::string_view bytes;
    std::shared_ptr<const void> owner;
  };
  // Payloads below this size are copied into the header buffer (a slice per
  // tiny field would cost more than the copy).
  static constexpr size_t kInlineLimit = 4096;

  const std::vector<Chunk>& chunks() const { return chunks_; }
  size_t size() const { return size_; }
  int64_t num_samples() const { return num_samples_; }
  // All chunks concatenated (tests, small messages).
  std::string Flatten() const;

 private:
  friend class BatchEncoder;
  std::vector<Chunk> chunks_;
  size_t size_ = 0;
  int64_t num_samples_ = 0;
};

// Frames OutSamples into SampleBatch messages of at most `max_bytes` (a
// single larger sample goes alone).
class BatchEncoder {
 public:
  explicit BatchEncoder(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Bytes `sample` adds to a SampleBatch (its tag and length included).
  static size_t FramedSize(const OutSample& sample);

  // Appends `sample` to the message being built; returns a finished message
  // first when the sample does not fit in it.
  void Add(OutSample sample, std::vector<EncodedMessage>* finished);
  // Finishes the current message, if it holds any sample.
  void Flush(std::vector<EncodedMessage>* finished);
  // Framed size of the samples added since the last finished message.
  size_t pending_bytes() const { return pending_bytes_; }

 private:
  void Encode(const OutSample& sample);
  void PutVarint(uint64_t v);
  void PutTag(int field, int wire_type);
  void PutBytesField(int field, absl::string_view bytes,
                     const std::shared_ptr<const void>& owner);
  void PutLength(int field, size_t length);
  void CutHeader();

  const size_t max_bytes_;
  std::vector<OutSample> pending_;
  size_t pending_bytes_ = 0;
  // While encoding: the header buffer and where the current run began.
  std::shared_ptr<std::string> header_;
  size_t run_start_ = 0;
  EncodedMessage* message_ = nullptr;
};

// Encoded size of a varint.
size_t VarintSize(uint64_t v);

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_SAMPLE_ENCODER_H_
