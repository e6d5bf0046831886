// The one place where absl::Status and grpc::Status are converted. Logic code
// returns absl::Status; only grpc_* adapter files call these.
#ifndef SLUICE_SERVER_COMMON_GRPC_STATUS_H_
#define SLUICE_SERVER_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace sluice {

// Maps code and message; a payload stored under kGrpcDetailsPayloadUrl becomes
// the status details (the `grpc-status-details-bin` trailer).
grpc::Status ToGrpcStatus(const absl::Status& status);

// Maps code and message; non-empty details are kept as the
// kGrpcDetailsPayloadUrl payload.
absl::Status FromGrpcStatus(const grpc::Status& status);

// Type URL of the absl::Status payload that carries serialized
// sluice.v1.RpcStatus details across the conversion.
inline constexpr char kGrpcDetailsPayloadUrl[] =
    "type.googleapis.com/sluice.v1.RpcStatus";

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_GRPC_STATUS_H_
