#include "server/common/grpc_status.h"

#include "absl/strings/cord.h"

namespace sluice {

// absl::StatusCode and grpc::StatusCode share the canonical numbering
// (google.rpc.Code), so the conversion is a cast; the static_asserts keep it
// honest.
static_assert(static_cast<int>(absl::StatusCode::kDataLoss) ==
              static_cast<int>(grpc::StatusCode::DATA_LOSS));
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
              static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
static_assert(static_cast<int>(absl::StatusCode::kAborted) ==
              static_cast<int>(grpc::StatusCode::ABORTED));

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.raw_code());
  auto details = status.GetPayload(kGrpcDetailsPayloadUrl);
  if (details.has_value()) {
    return grpc::Status(code, std::string(status.message()),
                        std::string(*details));
  }
  return grpc::Status(code, std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  int raw = static_cast<int>(status.error_code());
  // Codes outside the canonical range (a misbehaving peer) become UNKNOWN.
  if (raw < 0 || raw > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    raw = static_cast<int>(absl::StatusCode::kUnknown);
  }
  absl::Status result(static_cast<absl::StatusCode>(raw),
                      status.error_message());
  if (!status.error_details().empty()) {
    result.SetPayload(kGrpcDetailsPayloadUrl,
                      absl::Cord(status.error_details()));
  }
  return result;
}

}  // namespace sluice
