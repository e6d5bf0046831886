#include "server/dataserver/sample_encoder.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice::dataserver {
namespace {

OutField Raw(std::string name, const std::shared_ptr<std::string>& data) {
  OutField f;
  f.name = std::move(name);
  f.value.kind = DecodedField::Kind::kRaw;
  f.value.bytes = Payload{*data, data};
  return f;
}

OutSample MakeSample(int64_t index, size_t payload) {
  OutSample s;
  s.key = "k/" + std::to_string(index);
  s.index = index;
  s.fields.push_back(
      Raw("bin", std::make_shared<std::string>(payload, 'a' + index % 26)));
  OutField cls;
  cls.name = "cls";
  cls.value.kind = DecodedField::Kind::kInt;
  cls.value.int_value = index - 3;  // negatives too
  s.fields.push_back(cls);
  OutField tensor;
  tensor.name = "jpg";
  tensor.value.kind = DecodedField::Kind::kTensor;
  tensor.value.dtype = v1::DTYPE_UINT8;
  tensor.value.shape = {2, 3, 1};
  auto pixels = std::make_shared<std::string>("abcdef");
  tensor.value.bytes = Payload{*pixels, pixels};
  s.fields.push_back(tensor);
  OutField text;
  text.name = "txt";
  text.value.kind = DecodedField::Kind::kText;
  text.value.bytes = Payload{"", nullptr};
  s.fields.push_back(text);
  return s;
}

v1::Sample ToProto(const OutSample& s) {
  v1::Sample p;
  p.set_key(s.key);
  p.set_index(s.index);
  p.set_skipped(s.skipped);
  p.set_skip_reason(s.skip_reason);
  for (const OutField& f : s.fields) {
    v1::Field* out = p.add_fields();
    out->set_name(f.name);
    switch (f.value.kind) {
      case DecodedField::Kind::kRaw:
        out->set_raw(std::string(f.value.bytes.bytes));
        break;
      case DecodedField::Kind::kText:
        out->set_text(std::string(f.value.bytes.bytes));
        break;
      case DecodedField::Kind::kInt:
        out->set_int_value(f.value.int_value);
        break;
      case DecodedField::Kind::kTensor: {
        v1::Tensor* t = out->mutable_tensor();
        t->set_dtype(f.value.dtype);
        for (int64_t d : f.value.shape) t->add_shape(d);
        t->set_data(std::string(f.value.bytes.bytes));
        break;
      }
    }
  }
  return p;
}

// Byte-for-byte what protobuf serializes, for small and large payloads,
// skipped samples and index 0.
TEST(BatchEncoderTest, SameBytesAsProtobuf) {
  std::vector<OutSample> samples;
  for (int64_t i = 0; i < 6; ++i)
    samples.push_back(MakeSample(i, i == 3 ? 100000 : 10 * i));
  OutSample skipped;
  skipped.key = "bad";
  skipped.index = 9;
  skipped.skipped = true;
  skipped.skip_reason = "shard \"x.tar\", member \"bad.jpg\": undecodable";
  samples.push_back(skipped);
  v1::SampleBatch expected;
  for (const OutSample& s : samples) *expected.add_samples() = ToProto(s);

  BatchEncoder encoder(1 << 30);
  std::vector<EncodedMessage> messages;
  for (const OutSample& s : samples) encoder.Add(s, &messages);
  encoder.Flush(&messages);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].num_samples(), 7);
  EXPECT_EQ(messages[0].size(), expected.ByteSizeLong());
  EXPECT_EQ(messages[0].Flatten(), expected.SerializeAsString());
  // The 100 KB payload is referenced, not copied.
  bool referenced = false;
  for (const auto& c : messages[0].chunks())
    referenced |= c.bytes.size() == 100000;
  EXPECT_TRUE(referenced);
}

TEST(BatchEncoderTest, SplitsAtMaxBytesButSendsABigSampleAlone) {
  BatchEncoder encoder(1000);
  std::vector<EncodedMessage> messages;
  for (int64_t i = 0; i < 10; ++i) encoder.Add(MakeSample(i, 300), &messages);
  encoder.Add(MakeSample(10, 5000), &messages);
  encoder.Add(MakeSample(11, 10), &messages);
  encoder.Flush(&messages);
  int64_t total = 0, expected_index = 0;
  for (const EncodedMessage& m : messages) {
    v1::SampleBatch batch;
    ASSERT_TRUE(batch.ParseFromString(m.Flatten()));
    EXPECT_EQ(static_cast<int64_t>(batch.samples_size()), m.num_samples());
    if (batch.samples_size() > 1) {
      EXPECT_LE(m.size(), 1000u);
    }
    for (const v1::Sample& s : batch.samples())
      EXPECT_EQ(s.index(), expected_index++);
    total += m.num_samples();
  }
  EXPECT_EQ(total, 12);
  EXPECT_EQ(messages.size(), 7u);  // 2+2+2+2+2, the 5 KB sample, the last
}

}  // namespace
}  // namespace sluice::dataserver
