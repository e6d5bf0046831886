// The real sluice-dataserver binary on 127.0.0.1:0, read over real gRPC with
// the generated (typed) client.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "sluice/v1/dataserver.grpc.pb.h"
#include "tests/testing/http.h"
#include "tests/testing/image_fixtures.h"
#include "tests/testing/process.h"
#include "tests/testing/tar_writer.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::ServerProcess;
using ::sluice::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class DataServerBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jpeg_ = testing::EncodeJpeg(testing::TestPixels(80, 60, 3), 80, 60);
    testing::TarWriter tar;
    for (int i = 0; i < 50; ++i) {
      tar.File(absl::StrCat("s", i, ".jpg"), jpeg_)
          .File(absl::StrCat("s", i, ".cls"), std::to_string(i % 10));
    }
    mkdir(dir_.File("shards").c_str(), 0755);
    shard_ = dir_.File("shards/train-0.tar");
    testing::WriteFile(shard_, tar.Finish());
    testing::WriteFile(dir_.File("secret.tar"), "outside the roots");
    auto server = testing::StartServer("sluice-dataserver", dir_.path(),
                                       {"--roots=" + dir_.File("shards")});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::DataServer::NewStub(grpc::CreateChannel(
        server_.grpc_address, grpc::InsecureChannelCredentials()));
  }

  v1::ReadRequest Request(const std::string& url, int64_t begin, int64_t end) {
    v1::ReadRequest r;
    r.mutable_lease()->set_lease_id("it");
    r.mutable_lease()->mutable_unit()->mutable_shard()->set_url(url);
    r.mutable_lease()->mutable_unit()->set_begin(begin);
    r.mutable_lease()->mutable_unit()->set_end(end);
    return r;
  }

  grpc::Status Read(const v1::ReadRequest& r, std::vector<v1::Sample>* out) {
    grpc::ClientContext ctx;
    auto reader = stub_->ReadSamples(&ctx, r);
    v1::SampleBatch batch;
    while (reader->Read(&batch)) {
      for (const auto& s : batch.samples()) out->push_back(s);
    }
    return reader->Finish();
  }

  TempDir dir_;
  std::string shard_, jpeg_;
  ServerProcess server_;
  std::unique_ptr<v1::DataServer::Stub> stub_;
};

TEST_F(DataServerBinaryTest, StreamsRawAndDecodedSamples) {
  std::vector<v1::Sample> raw;
  ASSERT_TRUE(Read(Request(shard_, 10, 40), &raw).ok());
  ASSERT_EQ(raw.size(), 30u);
  for (int i = 0; i < 30; ++i) {
    EXPECT_EQ(raw[i].index(), 10 + i);
    EXPECT_EQ(raw[i].key(), absl::StrCat("s", 10 + i));
    EXPECT_EQ(raw[i].fields(0).raw(), jpeg_);
  }
  auto request = Request("file://" + shard_, 0, 5);
  request.mutable_decode()->set_decode(true);
  request.mutable_decode()->set_resize_shorter_side(30);
  request.mutable_decode()->set_crop_height(24);
  request.mutable_decode()->set_crop_width(24);
  std::vector<v1::Sample> decoded;
  ASSERT_TRUE(Read(request, &decoded).ok());
  ASSERT_EQ(decoded.size(), 5u);
  EXPECT_THAT(decoded[4].fields(0).tensor().shape(), ElementsAre(24, 24, 3));
  EXPECT_EQ(decoded[4].fields(1).int_value(), 4);

  auto metrics =
      testing::HttpGet("http://" + server_.metrics_address + "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(metrics->body,
              HasSubstr("sluice_dataserver_samples_served_total 35"));
  EXPECT_THAT(
      metrics->body,
      HasSubstr("sluice_dataserver_decode_seconds_count{codec=\"jpeg\"} 5"));
  // The decoder library's own CPU time, apart from the transforms.
  const std::string cpu =
      "sluice_dataserver_decoder_cpu_seconds_total{codec=\"jpeg\"} ";
  const size_t at = metrics->body.find(cpu);
  ASSERT_NE(at, std::string::npos) << metrics->body;
  const size_t from = at + cpu.size();
  double seconds = 0;
  ASSERT_TRUE(absl::SimpleAtod(
      metrics->body.substr(from, metrics->body.find('\n', from) - from),
      &seconds));
  EXPECT_GT(seconds, 0.0);
}

// The transforms through the real binary: RandomResizedCrop + flip to a
// CHW float16 tensor, counted in the transform metrics; a malformed spec is
// INVALID_ARGUMENT naming the field.
TEST_F(DataServerBinaryTest, TransformsShapeTheOutputAndBadSpecsNameTheField) {
  auto request = Request(shard_, 0, 4);
  v1::DecodeSpec* spec = request.mutable_decode();
  spec->set_decode(true);
  auto* crop = spec->add_transforms()->mutable_random_resized_crop();
  crop->set_height(16);
  crop->set_width(20);
  spec->add_transforms()->mutable_horizontal_flip()->set_p(0.5f);
  spec->set_layout(v1::IMAGE_LAYOUT_CHW);
  spec->mutable_to_float()->set_enabled(true);
  spec->mutable_to_float()->set_half(true);
  std::vector<v1::Sample> decoded;
  grpc::Status status = Read(request, &decoded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(decoded.size(), 4u);
  for (const v1::Sample& s : decoded) {
    EXPECT_EQ(s.fields(0).tensor().dtype(), v1::DTYPE_FLOAT16);
    EXPECT_THAT(s.fields(0).tensor().shape(), ElementsAre(3, 16, 20));
    EXPECT_EQ(s.fields(0).tensor().data().size(), 3u * 16 * 20 * 2);
  }
  auto metrics =
      testing::HttpGet("http://" + server_.metrics_address + "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(metrics->body,
              HasSubstr("sluice_dataserver_images_transformed_total 4"));
  EXPECT_THAT(
      metrics->body,
      HasSubstr("sluice_dataserver_transform_seconds_count{op=\"resize\"} 4"));

  crop->set_scale_min(0.9f);
  crop->set_scale_max(0.5f);
  std::vector<v1::Sample> none;
  status = Read(request, &none);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(
      status.error_message(),
      HasSubstr(
          "decode.transforms[0].random_resized_crop.scale_min (0.9) is greater "
          "than scale_max (0.5)"));
  EXPECT_TRUE(none.empty());
}

TEST_F(DataServerBinaryTest, ErrorsCarryTheRightCodes) {
  std::vector<v1::Sample> out;
  grpc::Status s = Read(Request(dir_.File("shards/../secret.tar"), 0, 1), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << s.error_message();
  s = Read(Request(dir_.File("shards/missing.tar"), 0, 1), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("missing.tar"));
  s = Read(Request(shard_, 45, 60), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(s.error_message(), HasSubstr("50 samples"));
  EXPECT_TRUE(out.empty());

  grpc::ClientContext ctx;
  v1::IndexShardRequest index_request;
  index_request.set_url(shard_);
  v1::ShardIndex index;
  ASSERT_TRUE(stub_->IndexShard(&ctx, index_request, &index).ok());
  EXPECT_EQ(index.num_samples(), 50);

  auto metrics =
      testing::HttpGet("http://" + server_.metrics_address + "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(metrics->body, HasSubstr("sluice_dataserver_stream_errors_total{"
                                       "code=\"PERMISSION_DENIED\"} 1"));
}

TEST_F(DataServerBinaryTest, AClientThatLeavesEarlyEndsTheStream) {
  grpc::ClientContext ctx;
  auto request = Request(shard_, 0, 50);
  request.set_max_batch_bytes(1);
  auto reader = stub_->ReadSamples(&ctx, request);
  v1::SampleBatch batch;
  ASSERT_TRUE(reader->Read(&batch));
  ctx.TryCancel();
  while (reader->Read(&batch)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server is still healthy and serving.
  std::vector<v1::Sample> out;
  ASSERT_TRUE(Read(Request(shard_, 0, 2), &out).ok());
  EXPECT_EQ(out.size(), 2u);
}

TEST_F(DataServerBinaryTest,
       AShardTruncatedInPlaceWhileStreamingIsDataLossNotACrash) {
  // A shard overwritten in place (not replaced by rename) while a trainer
  // reads it: the stream ends with DATA_LOSS naming the lease and the
  // shard, everything delivered before is the file's real bytes, and the
  // server (mapping the file) survives to serve other shards.
  testing::TarWriter tar;
  std::vector<std::string> payloads;
  for (int i = 0; i < 64; ++i) {
    payloads.push_back(std::string(40000, static_cast<char>('A' + i % 26)));
    tar.File(absl::StrCat("big", i, ".bin"), payloads.back());
  }
  const std::string big = dir_.File("shards/big.tar");
  testing::WriteFile(big, tar.Finish());
  // A client that lets the server run only ~64 KB ahead of what it has
  // read (no window growth), so the cut below lands where the server has
  // not read yet.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  auto stub = v1::DataServer::NewStub(grpc::CreateCustomChannel(
      server_.grpc_address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  auto request = Request(big, 0, 64);
  request.mutable_lease()->set_lease_id("job/e0/f9");
  request.set_max_batch_bytes(1);  // one sample per message
  auto reader = stub->ReadSamples(&ctx, request);
  v1::SampleBatch batch;
  ASSERT_TRUE(reader->Read(&batch));
  // Cut where sample 12 begins (512-byte header + 40,448 bytes of padded
  // data per member): what the server has read ahead by now (two messages
  // ready, one in gRPC's hands, the window) stays intact. A message in flight
  // over pages the file lost would fail in the kernel instead (EFAULT: the
  // connection breaks, UNAVAILABLE), as the README says.
  ASSERT_EQ(truncate(big.c_str(), 12 * 40960), 0);
  std::vector<v1::Sample> got(batch.samples().begin(), batch.samples().end());
  while (reader->Read(&batch))
    got.insert(got.end(), batch.samples().begin(), batch.samples().end());
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("job/e0/f9"));
  EXPECT_THAT(status.error_message(), HasSubstr(big));
  EXPECT_THAT(status.error_message(), HasSubstr("changed while being served"));
  EXPECT_THAT(status.error_message(), HasSubstr(", 491520 now"));
  ASSERT_LT(got.size(), 12u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].index(), static_cast<int64_t>(i));
    ASSERT_EQ(got[i].fields_size(), 1);
    EXPECT_EQ(got[i].fields(0).raw(), payloads[i]) << "sample " << i;
  }
  std::vector<v1::Sample> out;
  ASSERT_TRUE(Read(Request(shard_, 0, 3), &out).ok());
  EXPECT_EQ(out.size(), 3u);
  auto metrics =
      testing::HttpGet("http://" + server_.metrics_address + "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(
      metrics->body,
      HasSubstr("sluice_dataserver_shards_changed_while_served_total 1"));
  EXPECT_THAT(
      metrics->body,
      HasSubstr("sluice_dataserver_stream_errors_total{code=\"DATA_LOSS\"} 1"));
}

TEST(DataServerFlagsTest, MissingRootsIsAnError) {
  TempDir dir;
  auto child = testing::ChildProcess::Start(
      {testing::BinDir() + "/sluice-dataserver", "--listen=127.0.0.1:0",
       "--metrics_listen=off", "--roots="},
      dir.File("log"));
  ASSERT_TRUE(child.ok());
  auto code = child->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(testing::ReadWholeFile(dir.File("log")).value_or(""),
              HasSubstr("--roots"));
}

}  // namespace
}  // namespace sluice
