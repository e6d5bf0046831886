#include "server/common/grpc_status.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(GrpcStatusTest, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, EveryCanonicalCodeRoundTripsWithItsMessage) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status in(static_cast<absl::StatusCode>(code), "lease j/e1/u3");
    const grpc::Status g = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), "lease j/e1/u3");
    EXPECT_EQ(FromGrpcStatus(g), in);
  }
}

TEST(GrpcStatusTest, DetailsTravelBothWays) {
  absl::Status in = absl::DeadlineExceededError("barrier b: 1 missing");
  in.SetPayload(kGrpcDetailsPayloadUrl, absl::Cord("\x08\x04"));
  const grpc::Status g = ToGrpcStatus(in);
  EXPECT_EQ(g.error_details(), "\x08\x04");
  const absl::Status back = FromGrpcStatus(g);
  ASSERT_TRUE(back.GetPayload(kGrpcDetailsPayloadUrl).has_value());
  EXPECT_EQ(std::string(*back.GetPayload(kGrpcDetailsPayloadUrl)), "\x08\x04");
}

TEST(GrpcStatusTest, OutOfRangeCodeFromPeerBecomesUnknown) {
  const grpc::Status weird(static_cast<grpc::StatusCode>(99), "odd peer");
  const absl::Status s = FromGrpcStatus(weird);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "odd peer");
}

}  // namespace
}  // namespace sluice
