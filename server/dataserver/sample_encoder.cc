#include "server/dataserver/sample_encoder.h"

namespace sluice::dataserver {
namespace {

constexpr int kVarint = 0;
constexpr int kLen = 2;

size_t LenFieldSize(size_t length) {
  return 1 + VarintSize(length) + length;  // all our field numbers are < 16
}

size_t TensorBodySize(const DecodedField& v) {
  size_t n = 0;
  if (v.dtype != 0) n += 1 + VarintSize(static_cast<uint64_t>(v.dtype));
  if (!v.shape.empty()) {
    size_t packed = 0;
    for (int64_t d : v.shape) packed += VarintSize(static_cast<uint64_t>(d));
    n += LenFieldSize(packed);
  }
  if (!v.bytes.bytes.empty()) n += LenFieldSize(v.bytes.bytes.size());
  return n;
}

size_t FieldBodySize(const OutField& f) {
  size_t n = f.name.empty() ? 0 : LenFieldSize(f.name.size());
  switch (f.value.kind) {
    case DecodedField::Kind::kRaw:
    case DecodedField::Kind::kText:
      // Oneof members are written even when empty.
      n += LenFieldSize(f.value.bytes.bytes.size());
      break;
    case DecodedField::Kind::kTensor:
      n += LenFieldSize(TensorBodySize(f.value));
      break;
    case DecodedField::Kind::kInt:
      n += 1 + VarintSize(static_cast<uint64_t>(f.value.int_value));
      break;
  }
  return n;
}

size_t SampleBodySize(const OutSample& s) {
  size_t n = 0;
  if (!s.key.empty()) n += LenFieldSize(s.key.size());
  if (s.index != 0) n += 1 + VarintSize(static_cast<uint64_t>(s.index));
  for (const OutField& f : s.fields) n += LenFieldSize(FieldBodySize(f));
  if (s.skipped) n += 2;
  if (!s.skip_reason.empty()) n += LenFieldSize(s.skip_reason.size());
  if (s.piece != 0) n += 1 + VarintSize(static_cast<uint64_t>(s.piece));
  return n;
}

}  // namespace

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

std::string EncodedMessage::Flatten() const {
  std::string out;
  out.reserve(size_);
  for (const Chunk& c : chunks_) out.append(c.bytes.data(), c.bytes.size());
  return out;
}

size_t BatchEncoder::FramedSize(const OutSample& sample) {
  return LenFieldSize(SampleBodySize(sample));
}

void BatchEncoder::Add(OutSample sample,
                       std::vector<EncodedMessage>* finished) {
  size_t size = FramedSize(sample);
  if (!pending_.empty() && pending_bytes_ + size > max_bytes_) Flush(finished);
  pending_bytes_ += size;
  pending_.push_back(std::move(sample));
}

void BatchEncoder::Flush(std::vector<EncodedMessage>* finished) {
  if (pending_.empty()) return;
  finished->emplace_back();
  message_ = &finished->back();
  header_ = std::make_shared<std::string>();
  header_->reserve(64 * pending_.size() + 64);
  run_start_ = 0;
  for (const OutSample& s : pending_) Encode(s);
  CutHeader();
  message_->size_ = pending_bytes_;
  message_->num_samples_ = static_cast<int64_t>(pending_.size());
  // Header chunks were recorded as offsets; the buffer no longer grows, so
  // turn them into views now.
  for (EncodedMessage::Chunk& c : message_->chunks_) {
    if (c.owner == nullptr) {
      size_t offset = reinterpret_cast<size_t>(c.bytes.data());
      c.bytes = absl::string_view(header_->data() + offset, c.bytes.size());
      c.owner = header_;
    }
  }
  pending_.clear();
  pending_bytes_ = 0;
  header_.reset();
  message_ = nullptr;
}

void BatchEncoder::CutHeader() {
  if (header_->size() > run_start_) {
    // Offset smuggled in the pointer until Flush fixes it up.
    message_->chunks_.push_back(EncodedMessage::Chunk{
        absl::string_view(reinterpret_cast<const char*>(run_start_),
                          header_->size() - run_start_),
        nullptr});
  }
  run_start_ = header_->size();
}

void BatchEncoder::PutVarint(uint64_t v) {
  while (v >= 0x80) {
    header_->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  header_->push_back(static_cast<char>(v));
}

void BatchEncoder::PutTag(int field, int wire_type) {
  PutVarint(static_cast<uint64_t>(field << 3 | wire_type));
}

void BatchEncoder::PutLength(int field, size_t length) {
  PutTag(field, kLen);
  PutVarint(length);
}

void BatchEncoder::PutBytesField(int field, absl::string_view bytes,
                                 const std::shared_ptr<const void>& owner) {
  PutLength(field, bytes.size());
  if (bytes.size() < EncodedMessage::kInlineLimit || owner == nullptr) {
    header_->append(bytes.data(), bytes.size());
    return;
  }
  CutHeader();
  message_->chunks_.push_back(EncodedMessage::Chunk{bytes, owner});
}

void BatchEncoder::Encode(const OutSample& s) {
  PutLength(1, SampleBodySize(s));  // SampleBatch.samples
  if (!s.key.empty()) PutBytesField(1, s.key, nullptr);
  if (s.index != 0) {
    PutTag(2, kVarint);
    PutVarint(static_cast<uint64_t>(s.index));
  }
  for (const OutField& f : s.fields) {
    PutLength(3, FieldBodySize(f));  // Sample.fields
    if (!f.name.empty()) PutBytesField(1, f.name, nullptr);
    const DecodedField& v = f.value;
    switch (v.kind) {
      case DecodedField::Kind::kRaw:
        PutBytesField(2, v.bytes.bytes, v.bytes.owner);
        break;
      case DecodedField::Kind::kText:
        PutBytesField(5, v.bytes.bytes, v.bytes.owner);
        break;
      case DecodedField::Kind::kInt:
        PutTag(4, kVarint);
        PutVarint(static_cast<uint64_t>(v.int_value));
        break;
      case DecodedField::Kind::kTensor: {
        PutLength(3, TensorBodySize(v));
        if (v.dtype != 0) {
          PutTag(1, kVarint);
          PutVarint(static_cast<uint64_t>(v.dtype));
        }
        if (!v.shape.empty()) {
          size_t packed = 0;
          for (int64_t d : v.shape)
            packed += VarintSize(static_cast<uint64_t>(d));
          PutLength(2, packed);
          for (int64_t d : v.shape) PutVarint(static_cast<uint64_t>(d));
        }
        if (!v.bytes.bytes.empty())
          PutBytesField(3, v.bytes.bytes, v.bytes.owner);
        break;
      }
    }
  }
  if (s.skipped) {
    PutTag(4, kVarint);
    PutVarint(1);
  }
  if (!s.skip_reason.empty()) PutBytesField(5, s.skip_reason, nullptr);
  if (s.piece != 0) {
    PutTag(6, kVarint);
    PutVarint(static_cast<uint64_t>(s.piece));
  }
}

}  // namespace sluice::dataserver
